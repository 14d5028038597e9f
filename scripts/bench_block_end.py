"""What the end of a block costs on a GPU (the check of its latents and new cache entries, and their
commit): whole blocks of one engine run with CUDA graphs, the session's block end captured as CUDA
graphs (``graphed``, the default), op by op (``op-by-op``) and op by op without any of the step's
non-finite checks, its inputs' and its outputs' (``no-check``, for scale only: a session never skips
them), in one process, rotating which goes first.

    python scripts/bench_block_end.py EXPORT_DIR ENGINE --out RESULT.json

ENGINE is an AOTInductor package built by `wan-trt build` (run with CUDA graphs, as in `wan-trt bench`).
Reported per mode: steady-state block times (p50 and all) and the median of each stage's device time.
"""
from __future__ import annotations

import argparse
import json
import statistics

from wan_trt.engines.backends.aoti import AotiRunner
from wan_trt.engines.runtime import session as session_module
from wan_trt.engines.runtime.cuda_graph import CudaGraphRunner
from wan_trt.export.manifest import Manifest
from wan_trt.profiling import provenance, write_result
from wan_trt.stream import NoiseSource, synthetic_stream

MODES = ("graphed", "op-by-op", "no-check")


def run(export: str, engine: str, blocks: int, rounds: int) -> dict[str, list]:
    """Steady-state BlockResults per mode (each stream's first block dropped)."""
    manifest = Manifest.read(export)
    inputs = synthetic_stream(manifest.spec.config, blocks, seed=0)
    real, results = session_module.first_non_finite, {mode: [] for mode in MODES}
    for r in range(rounds):
        for mode in MODES[r % 3:] + MODES[:r % 3]:
            session_module.first_non_finite = (lambda tensors: None) if mode == "no-check" else real
            with CudaGraphRunner(AotiRunner(engine, manifest, single_threaded=True)) as runner:
                session = session_module.StreamingSession(runner, noise=NoiseSource(0))
                session.graph_block_end = mode == "graphed"
                results[mode] += session_module.stream_blocks(session, inputs, blocks)[1:]
    session_module.first_non_finite = real
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("export")
    parser.add_argument("engine")
    parser.add_argument("--blocks", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    results = run(args.export, args.engine, args.blocks, args.rounds)
    block_ms = {mode: [1e3 * b.seconds for b in rs] for mode, rs in results.items()}
    stages = {mode: {s: statistics.median(b.stage_ms[s] for b in rs) for s in rs[0].stage_ms}
              for mode, rs in results.items()}
    report = {**provenance(), "block_ms_p50": {m: statistics.median(v) for m, v in block_ms.items()},
              "stage_ms_median": stages, "block_ms": block_ms}
    print(json.dumps({k: report[k] for k in ("block_ms_p50", "stage_ms_median")}, indent=1))
    write_result(args.out, report)


if __name__ == "__main__":
    main()
