"""The fp8 precision: per-row e4m3 quantization, the FP8 linears, the model's accuracy under the policy."""
from __future__ import annotations

import pytest
import torch

from tests.conftest import SMALL, assert_close
from wan_trt.config_load import load_config
from wan_trt.engines.backends.torch import TorchRunner
from wan_trt.model import build_model
from wan_trt.errors import WanTrtError
from wan_trt.model.fp8 import (E4M3_MAX, FP8_LINEARS, Fp8Linear, quantize_rows, reference_fp8_linear,
                               reference_quantize_rows, use_fp8)
from wan_trt.model.init import stress_weights
from wan_trt.spec import PassSpec
from wan_trt.validate.fp8_policy import fp8_pass_errors, policy_failures

CUDA = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device with FP8 tensor cores")


@pytest.mark.parametrize("shape", [(3, 7, 5), (1, 13), (2, 1, 96)])
def test_quantize_rows_scales_each_row_to_the_e4m3_range(shape):
    x = torch.randn(shape) * torch.logspace(-3, 3, shape[-1])  # six decades inside each row
    x[..., 0] = 0.0
    data, scale = reference_quantize_rows(x)
    assert data.dtype == torch.float8_e4m3fn and scale.shape == (*shape[:-1], 1)
    assert_close(data.float().abs().amax(-1), torch.full(shape[:-1], E4M3_MAX), atol=0, what="row max")
    back = data.float() * scale
    # round to nearest with 3 mantissa bits: relative error <= 2^-4; below e4m3's smallest normal
    # (2^-6 of the unit scale) the absolute step is 2^-9, half of it the error
    bound = torch.maximum(x.abs() * 2.0 ** -4, scale * 2.0 ** -10)
    assert bool(((back - x).abs() <= bound * 1.0001).all()), float(((back - x).abs() / bound).max())


def test_quantize_rows_of_zeros_are_zeros_not_nan():
    data, scale = reference_quantize_rows(torch.zeros(2, 8))
    assert torch.equal(data.float(), torch.zeros(2, 8)) and bool(torch.isfinite(scale).all())


def test_fp8_linear_is_within_e4m3_rounding_of_the_linear():
    torch.manual_seed(0)
    linear = torch.nn.Linear(96, 40)
    x = torch.randn(2, 9, 96)
    with torch.no_grad():
        got, want = Fp8Linear(linear)(x), linear(x)
    rel = float((got - want).norm() / want.norm())
    assert 1e-3 < rel < 0.06, rel  # quantized (not the float GEMM), by about e4m3's rounding (~2-4 %)


def test_fp8_linear_shares_a_quantized_input():
    torch.manual_seed(0)
    linear = Fp8Linear(torch.nn.Linear(32, 16))
    x = torch.randn(4, 32)
    with torch.no_grad():
        assert torch.equal(linear(x), linear(quantize_rows(x)))


def test_use_fp8_replaces_exactly_the_fp8_linears():
    cfg = load_config("universal-small")
    model = build_model(cfg, torch.bfloat16).use_fp8()
    fp8 = {name for name, m in model.named_modules() if isinstance(m, Fp8Linear)}
    assert fp8 == {f"blocks.{i}.{path}" for i in range(len(model.blocks)) for path in FP8_LINEARS}
    block = model.blocks[0]
    assert not isinstance(block.cross_attn.q, Fp8Linear) and not isinstance(block.self_attn.k, Fp8Linear)


@pytest.mark.parametrize("name", SMALL)
@pytest.mark.parametrize("stress", [False, True], ids=["seeded", "stress"])
def test_fp8_model_meets_the_accuracy_policy(name, stress):
    """The policy an fp8 engine is checked by: every output's error at most 2x the bf16 model's (both vs
    fp32); the flow's error is larger than bf16's (the FP8 GEMMs did run)."""
    errors = fp8_pass_errors(load_config(name), stress)
    assert not policy_failures(errors), policy_failures(errors)
    assert errors["fp8"]["flow"] > errors["bf16"]["flow"] * 1.001, errors


def test_the_policy_refuses_an_output_past_twice_the_bf16_error_or_nan():
    errors = {"bf16": {"flow": 0.01, "a": 0.01, "b": 1e-5, "c": 0.01},
              "fp8": {"flow": 0.019, "a": 0.021, "b": 9e-4, "c": float("nan")}}
    assert set(policy_failures(errors)) == {"a", "c"}  # b: under the 1e-3 floor


def test_stress_weights_keep_the_function_and_make_outlier_channels():
    cfg = load_config("universal-small")
    spec = PassSpec.from_config(cfg, "fp32")
    feeds = {k: v.float() if v.is_floating_point() else v for k, v in spec.sample_inputs(0).items()}
    plain, stressed = build_model(cfg), stress_weights(build_model(cfg))
    seen = {}
    block = stressed.blocks[0]
    block.ffn[0].register_forward_hook(lambda m, args, out: seen.update(ffn_in=args[0]))
    a, b = (TorchRunner(m, spec).infer(feeds)["flow"] for m in (plain, stressed))
    assert_close(b, a, atol=1e-4 * float(a.abs().max()), what="flow")
    per_channel = seen["ffn_in"].abs().flatten(0, -2).amax(0)
    assert float(per_channel.max() / per_channel.median()) > 20  # a few channels far larger than the rest


@CUDA
def test_fp8_linear_on_cuda_equals_the_reference_gemm():
    torch.manual_seed(0)
    linear = torch.nn.Linear(256, 192).cuda().bfloat16()
    fp8 = Fp8Linear(linear)
    x = torch.randn(3, 70, 256, device="cuda", dtype=torch.bfloat16)
    with torch.no_grad():
        got = fp8(x)  # torch._scaled_mm (cuBLASLt)
        data, scale = reference_quantize_rows(x)
        want = reference_fp8_linear(data, scale, fp8.weight, fp8.weight_scale, fp8.bias, torch.float32)
    assert got.dtype == torch.bfloat16
    assert_close(got.float(), want, atol=2 ** -8 * float(want.abs().max()), rtol=2 ** -8, what="scaled_mm vs fp32")


def test_use_fp8_refuses_widths_the_fp8_gemm_cannot_take():
    block = torch.nn.Module()
    block.self_attn = torch.nn.Module()
    block.self_attn.o = torch.nn.Linear(24, 24)
    block.ffn = torch.nn.Sequential(torch.nn.Linear(24, 40), torch.nn.GELU(), torch.nn.Linear(40, 24))
    model = torch.nn.Module()
    model.blocks = torch.nn.ModuleList([block])
    with pytest.raises(WanTrtError, match="multiples of 16"):
        use_fp8(model)
