"""The decoder's wide 3-D convolutions at a steady block's shapes, their output channels computed in
different groupings (cuDNN, channels-last, benchmark mode): which one the engine form should take.

    python3 scripts/conv_widths.py --out RESULTS/conv_widths_<device>.json

A convolution with C outputs computed as groups (e.g. 64 + 32) is one cuDNN call per group over the same
input, each with its own filters; "128" means C padded with zero filters to 128. Each timing is as many
calls in a row as a block runs at that stage (about 15 ms of work, then a sync: shorter than a decoder
block, whose power draw lowers the clock, so a grouping that computes more may fare worse in the engine
than here), the rows taken in turn for ``--rounds`` rounds; the median per call is reported, and each
grouping's output is compared with the plain convolution's (same filters). Only the convolutions are
timed: not the join of a split output or the slice of a padded one (the engine's fused norms read both
as they are).
"""
from __future__ import annotations

import argparse
import statistics
import sys

import torch
import torch.nn.functional as F

from wan_trt.profiling import provenance, write_result

# (name, input channels, output channels, joined frames (2 of history + 12), height, width, calls a block)
STAGES = [("full_96", 96, 96, 14, 352, 640, 6), ("quarter_192", 192, 192, 14, 176, 320, 6)]
GROUPINGS = {96: [(128,), (96,), (64, 32), (32, 32, 32), (48, 48)],
             192: [(128, 64), (192,), (64, 64, 64), (96, 96), (256,)]}


def time_calls(fn, calls: int) -> float:
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(calls):
        fn()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) / calls


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", required=True)
    parser.add_argument("--rounds", type=int, default=12)
    parser.add_argument("--dtype", default="bfloat16")
    args = parser.parse_args()
    torch.backends.cudnn.benchmark = True
    dtype = getattr(torch, args.dtype)
    cl = torch.channels_last_3d
    rows = []
    for name, cin, cout, frames, h, w, calls in STAGES:
        gen = torch.Generator(device="cuda").manual_seed(0)
        x = torch.randn(1, cin, frames, h, w, device="cuda", generator=gen).to(dtype).contiguous(memory_format=cl)
        weight = (torch.randn(cout, cin, 3, 3, 3, device="cuda", generator=gen) / (27 * cin) ** 0.5).to(dtype)
        plain = F.conv3d(x, weight.contiguous(memory_format=cl), padding=(0, 1, 1)).float()
        variants = {}
        for groups in GROUPINGS[cout]:
            parts, at = [], 0
            for g in groups:
                w_g = weight[at:at + g]
                if w_g.shape[0] < g:  # zero filters up to the group's width
                    w_g = torch.cat([w_g, w_g.new_zeros(g - w_g.shape[0], *w_g.shape[1:])])
                parts.append(w_g.contiguous(memory_format=cl))
                at += g
            variants["+".join(map(str, groups))] = parts
        times = {k: [] for k in variants}
        errors = {}
        for key, parts in variants.items():  # warm-up (benchmark mode picks each algorithm here) and accuracy
            out = torch.cat([F.conv3d(x, p, padding=(0, 1, 1)) for p in parts], dim=1)[:, :cout].float()
            errors[key] = ((out - plain).norm() / plain.norm()).item()
            del out
        for _ in range(args.rounds):
            for key, parts in variants.items():
                times[key].append(time_calls(lambda: [F.conv3d(x, p, padding=(0, 1, 1)) for p in parts], calls))
        for key in variants:
            rows.append({"stage": name, "in": cin, "out": cout, "input": [1, cin, frames, h, w], "grouping": key,
                         "ms_per_call_median": statistics.median(times[key]), "ms_per_call_min": min(times[key]),
                         "calls_a_block": calls, "rel_l2_vs_plain": errors[key]})
            print(f"{name:12s} {key:10s} {rows[-1]['ms_per_call_median']:.3f} ms/call "
                  f"(min {rows[-1]['ms_per_call_min']:.3f}) rel-L2 {errors[key]:.1e}", file=sys.stderr)
        del x, plain, variants
        torch.cuda.empty_cache()
    result = {**provenance(device="cuda"), "cudnn": torch.backends.cudnn.version(), "dtype": args.dtype, "rows": rows}
    write_result(args.out, result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
