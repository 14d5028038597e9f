#!/usr/bin/env python3
"""The DiT pass's GEMMs shape by shape: cuBLAS's time per call, what a pass spends on each shape, and
what other ways to run the same arithmetic would take.

    python scripts/gemm_shapes.py --config universal --out bench/results/gemm_shapes_universal_bf16_<gpu>.json
                                  [--autotune] [--min-rows 1024]

The shapes are recorded from one pass of the graph form (`wan-trt export`'s prepared model, PyTorch ops)
on the meta device: every mm / addmm / bmm with its count a pass. On CUDA each shape with at least
``--min-rows`` rows is timed through the aten op the engine calls (cuBLAS / cuBLASLt, set up as the
runtime sets it up; the FFN's up-projection with its GELU epilogue, as the fused engine runs it), one
call replayed as a CUDA graph (device time, no launch overhead; an engine's own launches of a shape can
take less, its operands warm in L2 from the kernel before). Then:

    qkv_as_one     the self-attention's q, k and v projections (same input) as one [C, 3C] GEMM, with and
                   without a copy of its v third into a dense tensor (a cache output is dense)
    --autotune     each shape under torch.compile's max-autotune (Inductor's Triton GEMM templates beside
                   cuBLAS; the time of whichever it picks)

Output: per shape ms per call, calls per pass and ms per pass of each way. The attentions' batched GEMMs
are listed, not timed: engines run them as fused attention kernels.
"""
from __future__ import annotations

import argparse
import collections
import json
import sys
from pathlib import Path

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from wan_trt.config_load import load_config
from wan_trt.engines.runtime.cublas_workspace import prefer_workspace_free_gemms
from wan_trt.graphs import graph_kind
from wan_trt.profiling import provenance, write_result
from wan_trt.spec import PassSpec

aten = torch.ops.aten
GEMM_OPS = {aten.mm.default: "mm", aten.addmm.default: "addmm", aten.bmm.default: "bmm",
            aten.baddbmm.default: "baddbmm"}


class GemmRecorder(TorchDispatchMode):
    """Counts every GEMM call by (op, operand shapes)."""

    def __init__(self):
        super().__init__()
        self.calls: collections.Counter = collections.Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func in GEMM_OPS:
            self.calls[(GEMM_OPS[func], tuple(tuple(a.shape) for a in args if isinstance(a, torch.Tensor)))] += 1
        return func(*args, **(kwargs or {}))


def pass_gemms(config: str, precision: str) -> tuple[PassSpec, list[dict]]:
    """Every GEMM shape of one pass of ``config``'s graph form with its count a pass, most calls first."""
    spec = PassSpec.from_config(load_config(config), precision)
    kind = graph_kind(spec)
    recorder = GemmRecorder()
    with torch.device("meta"), torch.no_grad():
        static = kind.static(kind.prepare(kind.build(spec.config, spec.dtype, "meta"), "native", precision), spec)
        feeds = [torch.empty(spec.tensor(n).shape, dtype=spec.tensor(n).torch_dtype) for n in spec.input_names]
        with recorder:
            static(*feeds)
    rows = [{"op": op, "shapes": [list(s) for s in shapes], "calls_per_pass": n}
            for (op, shapes), n in recorder.calls.most_common()]
    return spec, rows


def gemm_dims(row: dict) -> tuple[int, int, int, int]:
    """(batch, M, N, K) of a recorded GEMM."""
    a, b = row["shapes"][-2:]
    return (a[0] if len(a) == 3 else 1), a[-2], b[-1], a[-1]


def timed(fn) -> float:
    """Device ms per call, replayed as a CUDA graph."""
    from triton.testing import do_bench_cudagraph
    return float(do_bench_cudagraph(fn, rep=200))


def operands(row: dict, dtype: torch.dtype) -> list[torch.Tensor]:
    gen = torch.Generator(device="cuda").manual_seed(0)
    return [torch.randn(s, device="cuda", generator=gen, dtype=dtype) / s[-1] ** 0.5 for s in row["shapes"]]


def gemm_call(row: dict, gelu: bool = False):
    """The aten call of ``row`` (the FFN's up-projection: with its GELU epilogue, as the fused engine runs it)."""
    op = row["op"]
    if op == "addmm" and gelu:
        return lambda b, a, w: aten._addmm_activation(b, a, w, use_gelu=True)
    return {"mm": torch.mm, "addmm": torch.addmm, "bmm": torch.bmm, "baddbmm": torch.baddbmm}[op]


def autotuned(fn, args: list[torch.Tensor]) -> float | str:
    """``fn`` under max-autotune: ms per call, or the error."""
    try:
        compiled = torch.compile(fn, mode="max-autotune-no-cudagraphs", dynamic=False)
        compiled(*args)
        return timed(lambda: compiled(*args))
    except Exception as exc:  # recorded: the other rows still run
        return f"{type(exc).__name__}: {exc}"[:300]


def write(report: dict, out: str) -> None:
    Path(out).parent.mkdir(parents=True, exist_ok=True)
    write_result(out, report)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", default="universal")
    parser.add_argument("--precision", default="bf16", choices=["bf16", "fp16"])
    parser.add_argument("--out", required=True)
    parser.add_argument("--autotune", action="store_true")
    parser.add_argument("--min-rows", type=int, default=1024)
    args = parser.parse_args()
    prefer_workspace_free_gemms()  # cuBLASLt as the engines' runtime sets it up, before the first GEMM
    spec, rows = pass_gemms(args.config, args.precision)
    dtype = spec.dtype
    width = spec.config.model.dim
    report = {**provenance(), "config": args.config, "precision": args.precision, "shapes": rows}
    if not torch.cuda.is_available():
        write(report, args.out)
        print(f"no CUDA device: the shapes only, in {args.out}", file=sys.stderr)
        return 0
    torch._inductor.config.max_autotune_gemm_backends = "ATEN,TRITON"
    ffn = [width, spec.config.model.ffn_dim]
    for row in rows:
        batch, m, n, k = gemm_dims(row)
        if m < args.min_rows:
            continue
        if row["op"] == "bmm":  # with this many rows, q.k or p.v of an attention (the main, cross or few-key one)
            row["engine"] = "a fused attention kernel (not timed here: scripts/bench_kernels.py)"
            continue
        gelu = row["op"] == "addmm" and row["shapes"][2] == ffn
        call, ops = gemm_call(row, gelu), operands(row, dtype)
        row["epilogue"] = "gelu" if gelu else None
        row["ms_per_call"] = timed(lambda: call(*ops))
        row["ms_per_pass"] = row["ms_per_call"] * row["calls_per_pass"]
        row["tflops"] = 2 * batch * m * n * k / (row["ms_per_call"] * 1e-3) / 1e12
        if args.autotune:
            row["ms_per_call_autotuned"] = autotuned(call, ops)
        print(json.dumps(row), file=sys.stderr, flush=True)
    # q, k and v of the self-attention as one GEMM
    tokens = spec.config.tokens_per_block
    gen = torch.Generator(device="cuda").manual_seed(0)
    x = torch.randn(tokens, width, device="cuda", generator=gen, dtype=dtype)
    w3 = torch.randn(width, 3 * width, device="cuda", generator=gen, dtype=dtype) / width ** 0.5
    b3 = torch.randn(3 * width, device="cuda", generator=gen, dtype=dtype)
    w1, b1 = w3[:, :width].contiguous(), b3[:width].contiguous()
    one = timed(lambda: torch.addmm(b1, x, w1))
    qkv = torch.addmm(b3, x, w3)
    report["qkv_as_one"] = {
        "tokens": tokens, "width": width,
        "three_gemms_ms": 3 * one,
        "one_gemm_ms": timed(lambda: torch.addmm(b3, x, w3)),
        "v_copy_ms": timed(lambda: qkv[:, 2 * width:].contiguous()),
        "one_gemm_autotuned_ms": autotuned(lambda b, a, w: torch.addmm(b, a, w), [b3, x, w3]) if args.autotune else None,
    }
    print(json.dumps(report["qkv_as_one"]), file=sys.stderr)
    timed_rows = [r for r in rows if "ms_per_pass" in r]
    report["ms_per_pass_timed_shapes"] = sum(r["ms_per_pass"] for r in timed_rows)
    write(report, args.out)
    print(f"wrote {args.out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
