#!/usr/bin/env python3
"""Two (or more) decoder engines of one config in one process: ms per decoded block, block by block in turn.

    python scripts/ab_decoder_engines.py old=out/old_dec/steady/E.pt2 new=out/dec/steady/E.pt2 --out ab.json

Each NAME=ENGINE is either engine of a decoder engine pair, run with CUDA graphs (``--backend``). Every engine
decodes the same seeded latents of ``--blocks`` blocks, one block each in turn (block b starts with engine b mod n,
so that no engine always follows the other), under the same clocks and power cap; the blocks after the first two
(``DECODER_WARMUP_BLOCKS``: graphs captured in both calls) are kept. The report gives each engine's median and the
median of the block-by-block differences against the first engine, and whether every engine's frames equal the
first's (the same arithmetic, differently scheduled, gives the same frames).
"""
from __future__ import annotations

import argparse
import statistics
import time

import torch

from wan_trt.engines.bench import DECODER_WARMUP_BLOCKS
from wan_trt.engines.runtime.decoder import DecoderStream
from wan_trt.errors import WanTrtError
from wan_trt.profiling import provenance, write_result
from wan_trt.validate.check_decoder import stream_latents


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("engines", nargs="+", help="NAME=ENGINE (either engine of a decoder pair)")
    parser.add_argument("--blocks", type=int, default=40)
    parser.add_argument("--backend", default="aoti-plugins+cudagraph")
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    named = dict(item.split("=", 1) for item in args.engines)
    if len(named) < 2 or args.blocks <= DECODER_WARMUP_BLOCKS:
        raise WanTrtError(f"give two NAME=ENGINE or more and --blocks over {DECODER_WARMUP_BLOCKS}")
    streams = {name: DecoderStream.from_engine(engine, args.backend, "cuda") for name, engine in named.items()}
    spec = next(iter(streams.values())).spec
    latents = stream_latents(spec, args.blocks, seed=0).to("cuda", spec.dtype)
    frames_per_block = spec.tensor("latents").shape[2]
    ms = {name: [] for name in streams}
    same = {name: True for name in streams}
    names = list(streams)
    for stream in streams.values():
        stream.__enter__()
    try:
        for b in range(args.blocks):
            z = latents[:, :, b * frames_per_block:(b + 1) * frames_per_block]
            order = names[b % len(names):] + names[:b % len(names)]
            frames = {}
            for name in order:
                torch.cuda.synchronize()
                begin = time.perf_counter()
                frames[name] = streams[name].decode(z)
                torch.cuda.synchronize()
                ms[name].append(1e3 * (time.perf_counter() - begin))
            for name in names[1:]:
                same[name] = same[name] and torch.equal(frames[name], frames[names[0]])
    finally:
        for stream in streams.values():
            stream.__exit__(None, None, None)
    kept = {name: values[DECODER_WARMUP_BLOCKS:] for name, values in ms.items()}
    rows = {name: {"engine": named[name], "block_ms_p50": statistics.median(values), "block_ms_all": ms[name],
                   "frames_equal_first": same[name]} for name, values in kept.items()}
    for name in names[1:]:
        diffs = [a - b for a, b in zip(kept[name], kept[names[0]])]
        rows[name]["median_diff_vs_first_ms"] = statistics.median(diffs)
        rows[name]["faster_than_first_blocks"] = sum(d < 0 for d in diffs)
    for name, row in rows.items():
        print(f"{name}: {row['block_ms_p50']:.2f} ms/block p50" + (
            f", {row['median_diff_vs_first_ms']:+.2f} ms vs {names[0]} (median of pairs; faster in "
            f"{row['faster_than_first_blocks']} of {len(kept[name])}), frames equal: {row['frames_equal_first']}"
            if name != names[0] else ""))
    write_result(args.out, {**provenance(device="cuda"), "blocks": args.blocks,
                            "kept_from_block": DECODER_WARMUP_BLOCKS, "backend": args.backend, "rows": rows})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
