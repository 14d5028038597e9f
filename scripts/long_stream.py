"""One long stream through an engine: does anything drift or grow over thousands of blocks?

    python scripts/long_stream.py EXPORT_DIR ENGINE --blocks 1500 --out RESULT.json

Streams ``--blocks`` blocks from block 0 in one session (``--backend``, by default the AOTInductor
engine with the fused kernels under CUDA graphs), synthetic inputs made in chunks so host memory stays flat too. Records every
block's time, the device memory at block 10 and at the last block (PyTorch's allocator: allocated
and reserved; the driver: used = total - free), and that every block came out finite (the
session refuses a non-finite block, so finishing means all were). Verdicts: memory equal, and the
p50 of the last 100 blocks within 3 % of the first 100's.
"""
from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

import torch

from wan_trt.engines.backends import RunnerSources, get_backend, make_runner
from wan_trt.engines.runtime.session import StreamingSession
from wan_trt.export.manifest import Manifest
from wan_trt.log import progress
from wan_trt.profiling import provenance, write_result
from wan_trt.stream import NoiseSource, synthetic_stream

CHUNK = 100  # blocks of synthetic input made at a time


def memory() -> dict[str, int]:
    free, total = torch.cuda.mem_get_info()
    return {"allocated": torch.cuda.memory_allocated(), "reserved": torch.cuda.memory_reserved(),
            "driver_used": total - free}


def long_stream(export: str, engine: str, blocks: int, backend: str) -> dict:
    manifest = Manifest.read(export)
    cfg = manifest.spec.config
    sources = RunnerSources(manifest.spec, "cuda", model=None, manifest=manifest, directory=Path(export),
                            engines={get_backend(backend).engine_key: Path(engine)})
    block_ms, memory_at, finite = [], {}, 0
    with make_runner(backend, sources) as runner:
        session = StreamingSession(runner, noise=NoiseSource(0))
        inputs = synthetic_stream(cfg, CHUNK, seed=0)
        session.start(inputs.visual_context.to("cuda", session.dtype))
        for block in progress(range(blocks), "blocks", total=blocks):
            if block % CHUNK == 0 and block:
                inputs = synthetic_stream(cfg, CHUNK, seed=block, first_block=block)
            mouse, keyboard = inputs.block_actions(cfg, block)
            move = (lambda t: None if t is None else t.to("cuda", session.dtype))
            result = session.step(move(inputs.block_cond(cfg, block)), move(mouse), move(keyboard))
            finite += bool(torch.isfinite(result.latents).all())
            block_ms.append(1e3 * result.seconds)
            if block in (10, blocks - 1) or block % 250 == 0:
                memory_at[block] = memory()
    first, last = statistics.median(block_ms[:100]), statistics.median(block_ms[-100:])
    return {**provenance(), "config": cfg.name, "precision": manifest.spec.precision, "backend": backend,
            "blocks": blocks, "latent_frames": blocks * cfg.block_frames, "finite_blocks": finite,
            "block_ms_p50_first_100": first, "block_ms_p50_last_100": last,
            "last_vs_first": last / first, "memory_bytes": memory_at,
            "memory_equal_block_10_and_last": memory_at[10] == memory_at[blocks - 1],
            "time_flat_within_3pct": abs(last / first - 1) <= 0.03, "block_ms": block_ms}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("export")
    parser.add_argument("engine")
    parser.add_argument("--blocks", type=int, default=1500)
    parser.add_argument("--backend", default="aoti-plugins+cudagraph")
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    if args.blocks < 200:
        parser.error("--blocks: at least 200 (the first and last 100 blocks are compared)")
    report = long_stream(args.export, args.engine, args.blocks, args.backend)
    print(json.dumps({k: v for k, v in report.items() if k not in ("block_ms", "memory_bytes")}, indent=1))
    write_result(args.out, report)


if __name__ == "__main__":
    main()
