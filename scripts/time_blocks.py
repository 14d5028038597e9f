#!/usr/bin/env python3
"""Milliseconds per streamed block of a DiT engine with CUDA graphs, as the runtime in use gives them.

    python scripts/time_blocks.py TAG EXPORT --out runs.jsonl       (one run: appends a line to runs.jsonl)
    python scripts/time_blocks.py --summarize runs.jsonl --out ab.json

EXPORT holds the AOTInductor engine with the fused kernels, where `wan-trt build` put it. One run streams
BLOCKS blocks and keeps those after the first SKIP. Only APIs every version of the runtime has are used,
so the same script times another commit's runtime (``PYTHONPATH`` pointing at its installed copy) on
the same engine: runs of two runtimes in turn, alternating, compare them (``scripts/gpu_bench.sh
ab-runtime``); the summary gives each tag's median over all its runs and each run's median, with the
tag's source and environment (one per tag: runs of one tag from other code or settings are refused), and
the environment every run shared.
"""
from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

BLOCKS = 66  # a run's time is mostly the engine's load and capture (about a minute): 64 kept blocks cost 5 s
SKIP = 2  # the first block (captures its graphs) and the one after


def run(tag: str, export: Path) -> dict:
    from wan_trt.engines.artifact import default_engine_path
    from wan_trt.engines.bench import Bench
    from wan_trt.engines.runtime.session import StreamingSession, stream_blocks
    from wan_trt.profiling import provenance
    from wan_trt.stream import NoiseSource, synthetic_stream

    engine = default_engine_path(export, "aoti", "cuda", "plugins")
    bench = Bench(export, "cuda", {"aoti-plugins": engine})
    inputs = synthetic_stream(bench.spec.config, BLOCKS, seed=0)
    with bench.runner("aoti-plugins+cudagraph") as runner:
        session = StreamingSession(runner, noise=NoiseSource(0))
        ms = [1e3 * r.seconds for r in stream_blocks(session, inputs, BLOCKS)[SKIP:]]
    return {**provenance(), "tag": tag, "export": str(export), "ms": ms}


def summarize(runs: list[dict]) -> dict:
    """Each tag's times over all its runs, with the source and environment they share (ValueError: a tag's runs
    differ in one, so their times are not of one setting)."""
    tags = list(dict.fromkeys(r["tag"] for r in runs))
    out = {}
    for tag in tags:
        mine = [r for r in runs if r["tag"] == tag]
        for key in ("source", "environment"):
            seen = sorted({json.dumps(r[key], sort_keys=True) for r in mine})
            if len(seen) > 1:
                raise ValueError(f"the runs of tag {tag!r} differ in their {key} ({'; '.join(seen)}): give runs of "
                                 "other code or settings their own tag")
        every = [m for r in mine for m in r["ms"]]
        out[tag] = {"p50": statistics.median(every), "mean": statistics.mean(every), "n": len(every),
                    "run_p50s": [round(statistics.median(r["ms"]), 3) for r in mine],
                    "source": mine[0]["source"], "environment": mine[0]["environment"]}
    return out


def shared(values: list[dict]) -> dict:
    """The fields every one of ``values`` holds with the same value."""
    return {k: v for k, v in values[0].items() if all(k in d and d[k] == v for d in values[1:])}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("tag", nargs="?")
    parser.add_argument("export", nargs="?", type=Path)
    parser.add_argument("--summarize", type=Path, metavar="RUNS_JSONL")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    if args.summarize:
        runs = [json.loads(line) for line in args.summarize.read_text().splitlines() if line.strip()]
        try:
            summary = summarize(runs)
        except ValueError as exc:
            parser.error(f"--summarize {args.summarize}: {exc}")
        for tag, s in summary.items():
            print(f"{tag}: {s['p50']:.2f} ms/block p50, mean {s['mean']:.2f} ({s['n']} blocks; runs {s['run_p50s']})")
        # the file's command is this one; the environment what every run shared (each tag's is in its summary,
        # each run keeps its own command and code)
        from wan_trt.profiling import command_line, write_result
        write_result(args.out, {"command": command_line(), "environment": shared([r["environment"] for r in runs]),
                                "ms_per_block": summary, "runs": runs})
        return
    if args.tag is None or args.export is None:
        parser.error("give TAG EXPORT (one run) or --summarize RUNS_JSONL")
    result = run(args.tag, args.export)
    print(args.tag, f"{statistics.median(result['ms']):.2f} ms/block p50", flush=True)
    with args.out.open("a") as f:
        f.write(json.dumps(result) + "\n")


if __name__ == "__main__":
    main()
