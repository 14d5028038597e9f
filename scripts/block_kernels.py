#!/usr/bin/env python3
"""Every kernel of one streamed block of a DiT engine with CUDA graphs: name, launches, device ms.

    python scripts/block_kernels.py TAG EXPORT     (writes $OUT/kernels_TAG.json, OUT defaults to /tmp)

EXPORT holds the AOTInductor engine with the fused kernels (``EXPORT/engine_aoti_plugins_cuda.pt2``).
The session streams 6 blocks, then one more block (the 7th: previous frames in the window) runs under
the profiler. Two engines' tables say which kernels a change removed or added and how much device
time a block lost or gained, independent of the wall clock's run-to-run spread.
"""
from __future__ import annotations

import collections
import json
import os
import sys
from pathlib import Path

import torch

from wan_trt.engines.backends.inductor_fixes import make_libstdcxx_global

make_libstdcxx_global()
from wan_trt.engines.bench import Bench  # noqa: E402  (after the C++ runtime's libstdc++ is global)
from wan_trt.engines.runtime.session import StreamingSession, stream_blocks  # noqa: E402
from wan_trt.stream import NoiseSource, synthetic_stream  # noqa: E402

WARM_BLOCKS = 6


def main() -> None:
    tag, export = sys.argv[1:3]
    bench = Bench(Path(export), "cuda", {"aoti-plugins": Path(export) / "engine_aoti_plugins_cuda.pt2"})
    runner = bench.runner("aoti-plugins+cudagraph")
    inputs = synthetic_stream(bench.spec.config, WARM_BLOCKS + 3, seed=0)
    with runner:
        session = StreamingSession(runner, noise=NoiseSource(0))
        stream_blocks(session, inputs, WARM_BLOCKS)
        cfg = session.cfg
        mouse, keyboard = inputs.block_actions(cfg, WARM_BLOCKS)
        to_device = lambda t: None if t is None else t.to(session.device, session.dtype)  # noqa: E731
        args = (to_device(inputs.block_cond(cfg, WARM_BLOCKS)), to_device(mouse), to_device(keyboard))
        torch.cuda.synchronize()
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
            session.step(*args)
            torch.cuda.synchronize()
    per_kernel = collections.defaultdict(lambda: [0, 0.0])  # name -> [launches, ms]
    for event in prof.events():
        if event.device_type.name == "CUDA":
            entry = per_kernel[event.name]
            entry[0] += 1
            entry[1] += event.device_time / 1e3
    rows = sorted(([name, n, round(ms, 4)] for name, (n, ms) in per_kernel.items()), key=lambda r: -r[2])
    result = {"tag": tag, "kernels_per_block": sum(r[1] for r in rows),
              "busy_ms_per_block": round(sum(r[2] for r in rows), 3), "rows": rows}
    print(tag, result["kernels_per_block"], result["busy_ms_per_block"])
    with open(os.path.join(os.environ.get("OUT", "/tmp"), f"kernels_{tag}.json"), "w") as f:
        json.dump(result, f, indent=0)


if __name__ == "__main__":
    main()
