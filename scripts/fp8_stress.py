#!/usr/bin/env python3
"""Where the fp8 precision passes and fails the accuracy policy: seeded weights and stress weights.

    python scripts/fp8_stress.py --config universal --device cuda --out bench/results/fp8_stress_universal_h100.json

For each weight set (the seeded random weights; the same made stressful: a few input channels of
every layer's self-attention and FFN 30-100x larger, :func:`wan_trt.model.init.stress_weights`), one
steady pass of the PyTorch model with its FP8 GEMMs (on CUDA the engine's ops) against the fp32
model, the bf16 model as the yardstick: every output's rel-L2, its allowance (2x bf16's, at least
1e-3), and the outputs the policy refuses (:mod:`wan_trt.validate.fp8_policy`). This judges the
fp8 arithmetic, not a built engine (`wan-trt check` judges engines).
"""
from __future__ import annotations

import argparse
from pathlib import Path

from wan_trt.config_load import load_config
from wan_trt.log import stage
from wan_trt.profiling import provenance, write_result
from wan_trt.validate.fp8_policy import allowed_rel_l2, fp8_pass_errors, policy_failures


def weight_set(cfg, stress: bool, device: str) -> dict:
    with stage(f"one pass of {cfg.name} in fp32, bf16 and fp8 ({'stress' if stress else 'seeded'} weights)"):
        errors = fp8_pass_errors(cfg, stress, device)
    allowed, failing = allowed_rel_l2(errors), policy_failures(errors)
    outputs = {k: {"bf16_rel_l2": errors["bf16"][k], "fp8_rel_l2": e, "allowed_rel_l2": allowed[k],
                   "ok": k not in failing} for k, e in errors["fp8"].items()}
    worst = max(outputs, key=lambda k: outputs[k]["fp8_rel_l2"] / outputs[k]["allowed_rel_l2"])
    return {"ok": not failing, "failing": sorted(failing), "flow": outputs["flow"], "worst": worst,
            "worst_fraction_of_allowance": outputs[worst]["fp8_rel_l2"] / outputs[worst]["allowed_rel_l2"],
            "outputs": outputs}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--config", default="universal-small")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    cfg = load_config(args.config)
    report = {**provenance(device=args.device), "config": cfg.name,
              "weights": {name: weight_set(cfg, name == "stress", args.device) for name in ("seeded", "stress")}}
    for name, r in report["weights"].items():
        print(f"{name}: {'passes' if r['ok'] else 'FAILS'}; flow fp8 {100 * r['flow']['fp8_rel_l2']:.2f} % "
              f"(bf16 {100 * r['flow']['bf16_rel_l2']:.2f} %, allowed {100 * r['flow']['allowed_rel_l2']:.2f} %); "
              f"worst {r['worst']} at {r['worst_fraction_of_allowance']:.2f} of its allowance; "
              f"{len(r['failing'])} of {len(r['outputs'])} outputs refused{': ' + ', '.join(r['failing'][:8]) if r['failing'] else ''}")
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        write_result(args.out, report)


if __name__ == "__main__":
    main()
