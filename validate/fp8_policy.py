"""The fp8 precision under the accuracy policy, one weight set at a time: one pass of the PyTorch model
with its FP8 GEMMs (on CUDA the engine's ops: the Triton row quantization and cuBLASLt's scaled GEMM)
against the fp32 model, with the bf16 model as the yardstick (:mod:`wan_trt.validate.metrics`).

    errors = fp8_pass_errors(cfg, stress=True, device="cuda")   # {"bf16": {output: rel-L2}, "fp8": {...}}
    policy_failures(errors)                                      # {output: (fp8 rel-L2, allowed)} refused

``stress``: the weights of :func:`wan_trt.model.init.stress_weights` (a few input channels of every
layer's self-attention and FFN 30-100x larger, the same function), which per-token activation
scales must survive.
"""
from __future__ import annotations

import copy

import torch

from wan_trt.config import WanConfig
from wan_trt.engines.backends.torch import TorchRunner
from wan_trt.model import build_model
from wan_trt.model.init import stress_weights
from wan_trt.spec import PassSpec
from wan_trt.validate.metrics import error_stats, tolerance


@torch.no_grad()
def fp8_pass_errors(cfg: WanConfig, stress: bool, device: str | torch.device = "cpu", seed: int = 0
                    ) -> dict[str, dict[str, float]]:
    """rel-L2 from the fp32 model of each output of one steady pass (the flow and the new cache
    entries): the bf16 model's and the fp8 model's, on the seeded weights (``stress``: made stressful)."""
    spec = PassSpec.from_config(cfg, "bf16")
    feeds = {k: v.to(device) for k, v in spec.sample_inputs(seed).items()}
    model = build_model(cfg, torch.float32, seed=seed)
    model = stress_weights(model) if stress else model
    model = model.to(device)
    fp32 = TorchRunner(model, PassSpec.from_config(cfg, "fp32")).infer(
        {k: v.float() if v.is_floating_point() else v for k, v in feeds.items()})  # fresh tensors, not buffers
    bf16 = model.to(torch.bfloat16)  # the fp32 model is not needed again
    errors = {}
    for name in ("bf16", "fp8"):
        low = copy.deepcopy(bf16).use_fp8() if name == "fp8" else bf16
        outputs = TorchRunner(low, spec).infer(feeds)
        errors[name] = {k: error_stats(outputs[k].float(), fp32[k]).rel_l2 for k in spec.output_names}
        del outputs
    return errors


def allowed_rel_l2(errors: dict[str, dict[str, float]]) -> dict[str, float]:
    """Each output's allowance: the policy's multiple of the bf16 model's error, at least the fp8 floor."""
    return {k: tolerance(e, "fp8") for k, e in errors["bf16"].items()}


def policy_failures(errors: dict[str, dict[str, float]]) -> dict[str, tuple[float, float]]:
    """The outputs the policy refuses: {output: (fp8 rel-L2, allowed)}; NaN counts as refused."""
    allowed = allowed_rel_l2(errors)
    return {k: (e, allowed[k]) for k, e in errors["fp8"].items() if not e <= allowed[k]}
