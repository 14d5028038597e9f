#!/usr/bin/env python3
"""Every kernel of one streamed block of a DiT engine with CUDA graphs: name, launches, device ms.

    python scripts/block_kernels.py TAG EXPORT [--out DIR]     (writes DIR/kernels_TAG.json)

EXPORT holds the AOTInductor engine with the fused kernels, where `wan-trt build` put it. The session
streams 6 blocks, then one more block (the 7th: previous frames in the window) runs under the profiler.
Two engines' tables say which kernels a change removed or added and how much device time a block lost
or gained, independent of the wall clock's run-to-run spread. The table counts every device activity
of the block: the passes' kernels, memsets, and the session's own (re-noising, checks, cache commit).
"""
from __future__ import annotations

import argparse
import collections
import json
from pathlib import Path

import torch

from wan_trt.engines.artifact import default_engine_path
from wan_trt.engines.bench import Bench
from wan_trt.engines.runtime.session import StreamingSession, stream_blocks
from wan_trt.profiling import provenance
from wan_trt.stream import NoiseSource, synthetic_stream

WARM_BLOCKS = 6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("tag")
    parser.add_argument("export", type=Path)
    parser.add_argument("--out", type=Path, default=Path("."))
    args = parser.parse_args()
    engine = default_engine_path(args.export, "aoti_plugins", "cuda")
    bench = Bench(args.export, "cuda", {"aoti-plugins": engine})
    inputs = synthetic_stream(bench.spec.config, WARM_BLOCKS + 1, seed=0)
    with bench.runner("aoti-plugins+cudagraph") as runner:
        session = StreamingSession(runner, noise=NoiseSource(0))
        stream_blocks(session, inputs, WARM_BLOCKS)
        mouse, keyboard = inputs.block_actions(session.cfg, WARM_BLOCKS)
        cond = inputs.block_cond(session.cfg, WARM_BLOCKS)
        torch.cuda.synchronize()
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
            session.step(cond, mouse, keyboard)
            torch.cuda.synchronize()
    per_kernel = collections.defaultdict(lambda: [0, 0.0])  # name -> [launches, ms]
    for event in prof.events():
        if event.device_type.name == "CUDA":
            entry = per_kernel[event.name]
            entry[0] += 1
            entry[1] += event.device_time / 1e3
    rows = sorted(([name, n, round(ms, 4)] for name, (n, ms) in per_kernel.items()), key=lambda r: -r[2])
    result = {**provenance(), "tag": args.tag, "kernels_per_block": sum(r[1] for r in rows),
              "busy_ms_per_block": round(sum(r[2] for r in rows), 3), "rows": rows}
    print(args.tag, result["kernels_per_block"], result["busy_ms_per_block"])
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / f"kernels_{args.tag}.json").write_text(json.dumps(result, indent=0))


if __name__ == "__main__":
    main()
