#!/usr/bin/env python3
"""Two (or more) DiT engines of one config in one process: ms per streamed block, alternating rounds.

    python scripts/ab_engines.py old=out/old_bf16 new=out/universal_bf16_aoti --out ab.json

Each NAME=EXPORT is an export whose AOTInductor engine with the fused kernels was built
(``EXPORT/engine_aoti_plugins_cuda.pt2``). Every engine runs with CUDA graphs in its own session;
each round streams ROUND_BLOCKS blocks through every engine in turn, always in the given order (so no
engine ever follows itself), and keeps the blocks after the first two of each stream; round 0 only
warms up. Engines in one process on one GPU see the same clocks and power cap, which separate
`wan-trt bench` runs do not (two builds of the same code measured 89.1 and 90.4 ms/block in two runs
on one H100). An earlier form of this script reversed the order every other round: at each round's
boundary an engine then ran twice in a row, and those streams ran slower, for either engine.

``--interleave N`` streams N blocks through every engine one block each in turn instead: each block of
one engine has a neighbour of the other under the same clocks and power draw, and the report adds the
block-by-block differences against the first engine (their median, and in how many pairs each engine
was faster). Rounds of whole streams gave 1-2 ms differences between rounds of one engine, as large as
the levers measured with them. The order turns every block (block b starts with engine b mod n): with a
fixed order the engines' difference cannot be told from an effect of the order (the first engine alone
steps right after the host has prepared a block's inputs). On an H100 such a run found the first engine
0.6 ms a block faster than the second (median of the pairs; 1.0 against the second's block before it),
where rounds of whole streams of the same two engines, the other one first, had found it 1.1 ms slower.
The report gives the differences apart by which engine stepped first too; their mean is the engines'
difference, half their spread the order's.
"""
from __future__ import annotations

import argparse
import statistics
from pathlib import Path

from wan_trt.engines.artifact import default_engine_path
from wan_trt.engines.bench import Bench
from wan_trt.engines.runtime.session import BlockResult, StreamingSession, stream_blocks
from wan_trt.errors import WanTrtError
from wan_trt.profiling import provenance, write_result
from wan_trt.stream import NoiseSource, synthetic_stream

ROUNDS = 5
ROUND_BLOCKS = 8
SKIP = 2  # blocks of each stream not kept: its first (no previous frames) and the one after


def block_order(names: list[str], block: int) -> list[str]:
    """The order the engines step in at ``block``: turned by one every block."""
    turn = block % len(names)
    return names[turn:] + names[:turn]


def interleaved(sessions: dict[str, StreamingSession], inputs, blocks: int) -> dict[str, list[BlockResult]]:
    """Stream the same ``blocks`` blocks of ``inputs`` through every session from a fresh start, one block of
    each session in turn (in :func:`block_order`); returns each session's block results in block order."""
    cfg = next(iter(sessions.values())).cfg
    for session in sessions.values():
        session.start(inputs.visual_context.to(session.device))
    results: dict[str, list[BlockResult]] = {name: [] for name in sessions}
    for block in range(blocks):
        mouse, keyboard = inputs.block_actions(cfg, block)
        cond = inputs.block_cond(cfg, block)
        for name in block_order(list(sessions), block):
            session = sessions[name]
            move = (lambda t: None if t is None else t.to(session.device))  # noqa: E731  (the session checks)
            results[name].append(session.step(move(cond), move(mouse), move(keyboard)))
    return results


def paired(samples: dict[str, list[float]], first_block: int = 0) -> dict[str, dict]:
    """Per engine after the first: the block-by-block differences from the first engine's blocks (ms,
    positive: slower), their median, in how many of the pairs the engine was faster, and the medians
    apart by whether the engine stepped before the first engine or after it (``samples`` start at
    block ``first_block`` of an interleaved stream, :func:`block_order`)."""
    names = list(samples)
    base = samples[names[0]]
    out = {}
    for name in names[1:]:
        diffs = [a - b for a, b in zip(samples[name], base)]
        by_order: dict[str, list[float]] = {"ran_first": [], "ran_second": []}
        for i, d in enumerate(diffs):
            order = block_order(names, first_block + i)
            by_order["ran_first" if order.index(name) < order.index(names[0]) else "ran_second"].append(d)
        out[name] = {"against": names[0], "median_diff_ms": statistics.median(diffs),
                     "faster_in": sum(d < 0 for d in diffs), "pairs": len(diffs),
                     "median_diff_ms_by_order": {k: statistics.median(v) if v else None for k, v in by_order.items()}}
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("engines", nargs="+", metavar="NAME=EXPORT")
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--interleave", type=int, default=0, metavar="N",
                        help="one stream of N blocks per engine, a block of each in turn (module docstring)")
    args = parser.parse_args()
    if args.interleave and args.interleave <= SKIP:
        parser.error(f"--interleave: more than {SKIP} blocks (the first {SKIP} of a stream are not kept)")
    pairs = [e.split("=", 1) for e in args.engines]
    if len(pairs) < 2 or any(len(p) != 2 for p in pairs) or len({n for n, _ in pairs}) != len(pairs):
        raise WanTrtError("give two or more engines as NAME=EXPORT with distinct names")
    sessions, runners, config = {}, [], None
    for name, export in pairs:
        engine = default_engine_path(Path(export), "aoti", "cuda", "plugins")  # where `wan-trt build` put it
        bench = Bench(Path(export), "cuda", {"aoti-plugins": engine})
        if config is not None and bench.spec.config != config:
            raise WanTrtError(f"{name}: {export} is of config '{bench.spec.config.name}', not '{config.name}'")
        config = bench.spec.config
        runners.append(bench.runner("aoti-plugins+cudagraph").__enter__())
        sessions[name] = StreamingSession(runners[-1], noise=NoiseSource(0))
    names = list(sessions)
    kept: dict[str, list[float]] = {n: [] for n in names}
    try:
        if args.interleave:
            inputs = synthetic_stream(config, args.interleave, seed=0)
            for name, results in interleaved(sessions, inputs, args.interleave).items():
                kept[name] = [1e3 * r.seconds for r in results[SKIP:]]
        else:
            inputs = synthetic_stream(config, ROUND_BLOCKS, seed=0)
            for rnd in range(ROUNDS):
                for name in names:
                    ms = [1e3 * r.seconds for r in stream_blocks(sessions[name], inputs, ROUND_BLOCKS)[SKIP:]]
                    if rnd > 0:
                        kept[name] += ms
                    print(rnd, name, [round(m, 2) for m in ms], flush=True)
    finally:
        for runner in runners:
            runner.__exit__(None, None, None)
    summary = {n: {"p50": statistics.median(v), "mean": statistics.mean(v), "n": len(v)} for n, v in kept.items()}
    for name, s in summary.items():
        print(f"{name}: {s['p50']:.2f} ms/block p50, mean {s['mean']:.2f} ({s['n']} blocks)")
    pairs_report = paired(kept, SKIP) if args.interleave else None
    for name, p in (pairs_report or {}).items():
        order = ", ".join(f"{k.replace('_', ' ')} {v:+.2f}" for k, v in p["median_diff_ms_by_order"].items()
                          if v is not None)
        print(f"{name} - {p['against']}: median {p['median_diff_ms']:+.2f} ms a block ({order}), faster in "
              f"{p['faster_in']} of {p['pairs']} pairs")
    if args.out:
        write_result(args.out, {**provenance(), "config": config.name, "engines": dict(pairs),
                                "mode": f"interleaved, {args.interleave} blocks" if args.interleave else
                                f"{ROUNDS} rounds of {ROUND_BLOCKS} blocks, the first a warm-up",
                                "ms_per_block": summary, "paired": pairs_report, "samples": kept})


if __name__ == "__main__":
    main()
