#!/usr/bin/env python3
"""Benchmark the PyTorch reference on a GPU: upstream-semantics pipeline and static-cache session.

    python scripts/bench_reference.py --config universal --precision bf16 --blocks 6 \
        --out bench/results/reference_universal_bf16_h100.json [--compile] [--profile] [--accuracy]

Measures ms per pass, ms per block (steady state: blocks after the first), video
frames per second and peak memory; with --profile, device time of one steady-state
pass by op class; with --accuracy, the bf16 model's error against an fp32 model on
the same inputs (the yardstick of the accuracy policy). Writes one JSON file with
the command and the device.
"""
from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch

from wan_trt.config import load_config
from wan_trt.engines.bench import bench_session, bench_upstream
from wan_trt.engines.torch_runner import TorchRunner
from wan_trt.model import build_model
from wan_trt.model.static_pass import StaticPass
from wan_trt.profiling import op_class_profile, peak_memory_gib, provenance, reset_peak_memory, time_fn
from wan_trt.spec import PassSpec, precision_dtype
from wan_trt.stream import synthetic_stream
from wan_trt.validate.metrics import error_stats


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--config", default="universal")
    p.add_argument("--precision", default="bf16", choices=["bf16", "fp16", "fp32"])
    p.add_argument("--blocks", type=int, default=6)
    p.add_argument("--compile", action="store_true", help="also time torch.compile of the static pass")
    p.add_argument("--profile", action="store_true", help="op-class profile of one steady-state pass")
    p.add_argument("--accuracy", action="store_true", help="bf16/fp16 model vs fp32 model, one pass")
    p.add_argument("--device", default="cuda")
    p.add_argument("--out", type=Path, required=True)
    return p.parse_args()


def time_compiled(model, spec, cfg, inputs, feeds, args) -> dict:
    t0 = time.perf_counter()
    runner = TorchRunner(model, spec, compile=True)
    runner.infer(feeds)
    out = {"compile_s": time.perf_counter() - t0,
           "static_pass_compiled_ms": time_fn(lambda: runner.infer(feeds), device=args.device)}
    reset_peak_memory()
    out["static_session_compiled"] = bench_session(runner, inputs, args.blocks)
    out["static_session_compiled"]["peak_mem_gib"] = peak_memory_gib()
    return out


def main() -> None:
    args = parse_args()
    cfg = load_config(args.config)
    dtype = precision_dtype(args.precision)
    result = {**provenance(),
              "config": cfg.name, "precision": args.precision, "blocks": args.blocks, "weights": "random (seed 0)"}

    def save():
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(result, indent=2))

    t0 = time.perf_counter()
    model = build_model(cfg, dtype, args.device, seed=0)
    result["build_s"] = time.perf_counter() - t0
    inputs = synthetic_stream(cfg, args.blocks, seed=0)
    spec = PassSpec.from_config(cfg, args.precision)

    reset_peak_memory()
    result["reference_pipeline"] = bench_upstream(model, inputs, args.blocks)
    result["reference_pipeline"]["peak_mem_gib"] = peak_memory_gib()
    print("reference pipeline", json.dumps(result["reference_pipeline"]["block_ms"]), flush=True)
    save()

    reset_peak_memory()
    result["static_session_eager"] = bench_session(TorchRunner(model, spec), inputs, args.blocks)
    result["static_session_eager"]["peak_mem_gib"] = peak_memory_gib()
    print("static session eager", json.dumps(result["static_session_eager"]["block_ms"]), flush=True)
    save()

    feeds = spec.sample_inputs(seed=1, device=args.device)
    static = StaticPass(model, spec)
    with torch.no_grad():
        result["static_pass_eager_ms"] = time_fn(lambda: static(*(feeds[n] for n in spec.input_names)), device=args.device)
        if args.profile:
            result["profile_static_pass_eager"] = op_class_profile(
                lambda: static(*(feeds[n] for n in spec.input_names)))
            save()
        if args.compile:
            try:
                result.update(time_compiled(model, spec, cfg, inputs, feeds, args))
            except Exception as exc:  # record why, keep the other results
                result["compile_error"] = f"{type(exc).__name__}: {exc}"[:2000]
            save()
        if args.accuracy and dtype != torch.float32:
            torch.backends.cuda.matmul.allow_tf32 = False
            torch.backends.cudnn.allow_tf32 = False
            ref = StaticPass(build_model(cfg, torch.float32, args.device, seed=0), PassSpec.from_config(cfg, "fp32"))
            feeds32 = {k: v.float() if v.is_floating_point() else v for k, v in feeds.items()}
            expected = ref(*(feeds32[n] for n in spec.input_names))
            got = static(*(feeds[n] for n in spec.input_names))
            result["accuracy_vs_fp32"] = {name: error_stats(g, e).as_dict()
                                          for name, g, e in zip(spec.output_names, got, expected)}
            del ref
    save()
    print(json.dumps({k: v for k, v in result.items() if "profile" not in k}, indent=1)[:4000])


if __name__ == "__main__":
    main()
