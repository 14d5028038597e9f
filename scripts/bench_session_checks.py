"""What the session's per-block checks cost on a GPU: the non-finite check alone, and whole blocks
with the checks on and off (same engine, same process, alternating rounds).

    python scripts/bench_session_checks.py EXPORT_DIR ENGINE --out RESULT.json

ENGINE is an AOTInductor package built by `wan-trt build` (run with CUDA graphs, as in `wan-trt bench`).
"""
from __future__ import annotations

import argparse
import json
import statistics
import time

import torch

from wan_trt.engines.backends.aoti import AotiRunner
from wan_trt.engines.runtime import session as session_module
from wan_trt.engines.runtime.cuda_graph import CudaGraphRunner
from wan_trt.export.manifest import Manifest
from wan_trt.profiling import provenance
from wan_trt.stream import NoiseSource, synthetic_stream


def check_ms(tensors: dict[str, torch.Tensor], iters: int = 30) -> float:
    """Wall milliseconds of one ``first_non_finite`` call (it ends in a device sync)."""
    for _ in range(5):
        session_module.first_non_finite(tensors)
    torch.cuda.synchronize()
    begin = time.perf_counter()
    for _ in range(iters):
        session_module.first_non_finite(tensors)
    return (time.perf_counter() - begin) / iters * 1e3


def block_ms(export: str, engine: str, blocks: int, rounds: int) -> dict[str, list[float]]:
    """Steady-state block times with the checks on and off, alternating which goes first."""
    manifest = Manifest.read(export)
    inputs = synthetic_stream(manifest.spec.config, blocks, seed=0)
    real, times = session_module.first_non_finite, {"on": [], "off": []}
    for r in range(rounds):
        for mode in ("on", "off") if r % 2 == 0 else ("off", "on"):
            session_module.first_non_finite = real if mode == "on" else (lambda tensors: None)
            with CudaGraphRunner(AotiRunner(engine, manifest, single_threaded=True)) as runner:
                session = session_module.StreamingSession(runner, noise=NoiseSource(0))
                results = session_module.stream_blocks(session, inputs, blocks)
            times[mode] += [1e3 * b.seconds for b in results[1:]]
    session_module.first_non_finite = real
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("export")
    parser.add_argument("engine")
    parser.add_argument("--blocks", type=int, default=6)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    spec = Manifest.read(args.export).spec
    outputs = {t.name: torch.randn(t.shape, device="cuda").to(t.torch_dtype) for t in spec.outputs}
    times = block_ms(args.export, args.engine, args.blocks, args.rounds)
    report = {**provenance(), "non_finite_check_ms": check_ms(outputs),
              "block_ms_p50": {mode: statistics.median(v) for mode, v in times.items()}, "block_ms": times}
    print(json.dumps({k: report[k] for k in ("non_finite_check_ms", "block_ms_p50")}))
    with open(args.out, "w") as f:
        json.dump(report, f, indent=1)


if __name__ == "__main__":
    main()
