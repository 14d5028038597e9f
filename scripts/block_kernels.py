#!/usr/bin/env python3
"""Every kernel of one streamed block of a DiT engine with CUDA graphs: name, launches, device ms.

    python scripts/block_kernels.py TAG EXPORT [--out DIR]     (writes DIR/kernels_TAG.json)

EXPORT holds the AOTInductor engine with the fused kernels, where `wan-trt build` put it. The session
streams 6 blocks, then one more block (the 7th: previous frames in the window) runs under the profiler.
Two engines' tables say which kernels a change removed or added and how much device time a block lost
or gained, independent of the wall clock's run-to-run spread. The table counts every device activity
of the block: the passes' kernels, memsets, and the session's own (re-noising, checks, cache commit).
The ``timeline`` says where the device sat idle inside the block: the span from its first kernel's start
to its last one's end, the time no kernel ran in it, the gaps between kernels by length, the idle time
summed by the activity each gap follows (``idle_after``), and the longest gaps with the kernels either
side. ``--host`` also records the host (PyTorch's ops and the CUDA runtime's calls, each with the
innermost Python function around it outside torch and the standard library) and lists, for each of the
longest gaps, what the host started while the device waited, in order (the first and last
HOST_EVENTS / 2 of them when there are more). Recording the host slows it: time the
block without it.
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
from wan_trt.profiling import provenance, write_result
from wan_trt.stream import NoiseSource, synthetic_stream

WARM_BLOCKS = 6
GAP_BINS_US = (2, 5, 20, 100)  # gaps up to 2 us, 2-5, 5-20, 20-100, over 100
LONGEST = 12
HOST_EVENTS = 40  # host events listed per gap (--host)


def project_frame(event) -> str:
    """The innermost Python function around a profiled host ``event`` (its parents under the profiler's Python
    tracer, named 'file(line): function') that is neither torch's nor the standard library's; '' if none."""
    while event is not None:
        name = event.name
        if ".py(" in name and "torch/" not in name and "python3." not in name and not name.startswith("<"):
            return name
        event = event.cpu_parent
    return ""


def started_in(host: list[tuple[float, str]], begin: float, end: float) -> list[str]:
    """The host's events that started in [begin, end), in order, repeats dropped; the first and last
    HOST_EVENTS / 2 when there are more, with a count of those left out between them."""
    names = list(dict.fromkeys(name for t, name in sorted(host) if begin <= t < end))
    if len(names) <= HOST_EVENTS:
        return names
    half = HOST_EVENTS // 2
    return names[:half] + [f"... {len(names) - 2 * half} more ..."] + names[-half:]


def timeline(kernels: list[tuple[float, float, str]], host: list[tuple[float, str]] | None = None) -> dict:
    """Idle time between device activities (start us, end us, name) of one block; ``host``: (start us, name)
    of the host's events, listed per longest gap."""
    kernels = sorted(kernels)
    span = kernels[-1][1] - kernels[0][0]
    gaps, reach, last = [], kernels[0][1], kernels[0][2]  # last: the activity that ends at ``reach``
    for start, end, name in kernels[1:]:
        if start > reach:
            gaps.append((start - reach, last, name, reach, start))
        if end > reach:
            reach, last = end, name
    bins = collections.Counter()
    idle = collections.Counter()
    for gap, *_ in gaps:
        label = next((f"<={b}us" for b in GAP_BINS_US if gap <= b), f">{GAP_BINS_US[-1]}us")
        bins[label] += 1
        idle[label] += gap
    longest = sorted(gaps, reverse=True)[:LONGEST]
    idle_after = collections.defaultdict(lambda: [0, 0.0])  # the activity a gap follows -> [gaps, us]
    for gap, before, *_ in gaps:
        idle_after[before][0] += 1
        idle_after[before][1] += gap
    result = {"span_ms": round(span / 1e3, 3), "idle_ms": round(sum(g[0] for g in gaps) / 1e3, 3),
              "gaps": {label: [bins[label], round(idle[label] / 1e3, 3)] for label in sorted(bins)},
              "idle_after": [[name[:160], n, round(us / 1e3, 3)] for name, (n, us) in
                             sorted(idle_after.items(), key=lambda kv: -kv[1][1])[:LONGEST]],
              "longest_gaps_us": [[round(g, 1), before[:80], after[:80]] for g, before, after, *_ in longest]}
    if host is not None:
        result["host_in_longest_gaps"] = [
            {"gap_us": round(g, 1), "after": after[:80],
             "host_started": started_in(host, begin, end)} for g, _, after, begin, end in longest]
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("tag")
    parser.add_argument("export", type=Path)
    parser.add_argument("--out", type=Path, default=Path("."))
    parser.add_argument("--host", action="store_true", help="also record the host: what it did in the longest gaps")
    args = parser.parse_args()
    engine = default_engine_path(args.export, "aoti", "cuda", "plugins")
    bench = Bench(args.export, "cuda", {"aoti-plugins": engine})
    inputs = synthetic_stream(bench.spec.config, WARM_BLOCKS + 1, seed=0)
    with bench.runner("aoti-plugins+cudagraph") as runner:
        session = StreamingSession(runner, noise=NoiseSource(0))
        stream_blocks(session, inputs, WARM_BLOCKS)
        mouse, keyboard = inputs.block_actions(session.cfg, WARM_BLOCKS)
        cond = inputs.block_cond(session.cfg, WARM_BLOCKS)
        torch.cuda.synchronize()
        activities = [torch.profiler.ProfilerActivity.CUDA]
        activities += [torch.profiler.ProfilerActivity.CPU] if args.host else []
        with torch.profiler.profile(activities=activities, with_stack=args.host) as prof:
            session.step(cond, mouse, keyboard)
            torch.cuda.synchronize()
    per_kernel = collections.defaultdict(lambda: [0, 0.0])  # name -> [launches, ms]
    spans, host = [], []
    for event in prof.events():
        if event.device_type.name == "CPU":
            frame = project_frame(event.cpu_parent)
            host.append((event.time_range.start, f"{event.name} @ {frame}" if frame else event.name))
        elif event.device_type.name == "CUDA":
            entry = per_kernel[event.name]
            entry[0] += 1
            entry[1] += event.device_time / 1e3
            spans.append((event.time_range.start, event.time_range.end, event.name))
    rows = sorted(([name, n, round(ms, 4)] for name, (n, ms) in per_kernel.items()), key=lambda r: -r[2])
    result = {**provenance(), "tag": args.tag, "kernels_per_block": sum(r[1] for r in rows),
              "busy_ms_per_block": round(sum(r[2] for r in rows), 3),
              "timeline": timeline(spans, host if args.host else None), "rows": rows}
    print(args.tag, result["kernels_per_block"], result["busy_ms_per_block"], json.dumps(result["timeline"]))
    args.out.mkdir(parents=True, exist_ok=True)
    write_result(args.out / f"kernels_{args.tag}.json", result, indent=0)


if __name__ == "__main__":
    main()
