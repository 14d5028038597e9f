"""FP8 (e4m3) GEMMs for the ``fp8`` precision: which linears, how they are quantized, how they run.

    weight  W [N, K] -> W8 = e4m3(W / sw), sw [N] = amax_k |W| / 448      (per output channel, once)
    input   x [.., K] -> x8 = e4m3(x / sx), sx [.., 1] = amax_k |x| / 448  (per token, every call)
    (x / sx computed as x * (448 / amax), as the GPU kernel does; amax at least MIN_AMAX)
    y = (x8 @ W8^T) * sx * sw^T + b                                        (fp32 accumulation, bf16 out)

Which linears take FP8 (:data:`FP8_LINEARS`: each layer's self-attention output projection and
FFN, about 70 % of its GEMM FLOPs), by what an engine is checked on (every output within 2x the
bf16 model's error from fp32). Measured on an H100 with the universal config's seeded weights:
- the cross-attention's q and o in FP8 too: one pass's flow 3.59 % from fp32 (bf16: 1.61 %);
- q, k and v in FP8 too: the flow 1.35 %, the stream 1.06-1.12 % (allowed about 2.5 %), but the
  new K/V cache entries, which leave the graph straight from the k and v GEMMs, 3.7-4.0 % where
  2x bf16 allows 1.0-3.1 %.

On CUDA the GEMM is ``torch._scaled_mm`` (cuBLASLt, row-wise scales) and the quantization one
Triton kernel per input (``plugins/quantize_rows.py``; the FFN's GELU inside the one that makes the
down-projection's input). Elsewhere, and in the ONNX graph, the two steps are the custom ops
``wan_trt::fp8_quantize_rows`` and ``wan_trt::fp8_linear``: the same arithmetic in fp32, exported
as QuantizeLinear / DequantizeLinear + MatMul (``export/fp8.py``).
"""
from __future__ import annotations

from typing import NamedTuple

import torch
from torch import nn

from wan_trt.errors import WanTrtError

E4M3 = torch.float8_e4m3fn
E4M3_MAX = 448.0
MIN_AMAX = 1e-12  # an all-zero row quantizes to zeros, not NaN
# Module paths, inside each transformer layer, of the linears that run in FP8 (module docstring).
FP8_LINEARS = ("self_attn.o", "ffn.0", "ffn.2")
# What an fp8 engine's cache key records beside the weights (version: of the quantization arithmetic)
FP8_SCHEME = {"linears": FP8_LINEARS, "min_amax": MIN_AMAX, "version": 1}


class Fp8Rows(NamedTuple):
    """An activation quantized per row: ``data`` e4m3 [.., K], ``scale`` fp32 [.., 1], ``dtype`` of x."""
    data: torch.Tensor
    scale: torch.Tensor
    dtype: torch.dtype


def reference_quantize_rows(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """x [.., K] -> (e4m3 [.., K], fp32 scale [.., 1]): each row scaled so its largest |value| is 448
    (times 448 / amax, one multiplication per element, as the GPU kernel does)."""
    amax = x.abs().amax(-1, keepdim=True).float().clamp_min(MIN_AMAX)
    # Tensor-by-tensor divisions, IEEE on every device, as the kernel's: on CUDA a float divisor becomes a
    # product by its reciprocal, and a float dividend (448 / amax) takes 1 / amax first.
    e4m3_max = torch.full_like(amax, E4M3_MAX)
    return (x.float() * (e4m3_max / amax)).clamp(-E4M3_MAX, E4M3_MAX).to(E4M3), amax / e4m3_max


def reference_fp8_linear(data: torch.Tensor, scale: torch.Tensor, weight: torch.Tensor, weight_scale: torch.Tensor,
                         bias: torch.Tensor | None, dtype: torch.dtype) -> torch.Tensor:
    """The scaled FP8 GEMM in fp32 (e4m3 x e4m3 products are exact in fp32): [.., K] x [N, K] -> [.., N]."""
    y = torch.nn.functional.linear(data.float() * scale, weight.float() * weight_scale[:, None],
                                   None if bias is None else bias.float())
    return y.to(dtype)


@torch.library.custom_op("wan_trt::fp8_quantize_rows", mutates_args=())
def _quantize_rows_op(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    return reference_quantize_rows(x)


@_quantize_rows_op.register_fake
def _(x):
    return torch.empty_like(x, dtype=E4M3), x.new_empty((*x.shape[:-1], 1), dtype=torch.float32)


@torch.library.custom_op("wan_trt::fp8_linear", mutates_args=())
def _fp8_linear_op(data: torch.Tensor, scale: torch.Tensor, weight: torch.Tensor, weight_scale: torch.Tensor,
                   bias: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    return reference_fp8_linear(data, scale, weight, weight_scale, bias, dtype)


@_fp8_linear_op.register_fake
def _(data, scale, weight, weight_scale, bias, dtype):
    return data.new_empty((*data.shape[:-1], weight.shape[0]), dtype=dtype)


def quantize_rows(x: torch.Tensor, gelu: bool = False) -> Fp8Rows:
    """x (``gelu``: tanh-GELU of x) quantized per row: on CUDA one Triton kernel
    (``plugins/quantize_rows.py``), elsewhere the exportable custom op."""
    if x.is_cuda:
        import wan_trt.plugins.quantize_rows  # noqa: F401  (defines the op; deferred: it needs Triton)
        data, scale = torch.ops.wan_trt.quantize_rows_fp8(x.contiguous(), gelu)
    else:
        y = torch.nn.functional.gelu(x, approximate="tanh") if gelu else x
        data, scale = torch.ops.wan_trt.fp8_quantize_rows(y)
    return Fp8Rows(data, scale, x.dtype)


class Fp8Linear(nn.Module):
    """An ``nn.Linear`` whose GEMM runs in FP8 (module docstring); the bias stays in the model dtype.

    ``forward`` takes the input, or its :class:`Fp8Rows` (quantized where it is made).
    """

    def __init__(self, linear: nn.Linear):
        super().__init__()
        weight, scale = reference_quantize_rows(linear.weight.detach().float())  # per output channel
        self.register_buffer("weight", weight)  # [N, K] e4m3
        self.register_buffer("weight_scale", scale[:, 0])  # [N] fp32
        self.bias = linear.bias
        self.in_features, self.out_features = linear.in_features, linear.out_features

    def forward(self, x: torch.Tensor | Fp8Rows) -> torch.Tensor:
        rows = x if isinstance(x, Fp8Rows) else quantize_rows(x)
        if not rows.data.is_cuda:
            return torch.ops.wan_trt.fp8_linear(rows.data, rows.scale, self.weight, self.weight_scale, self.bias,
                                                rows.dtype)
        lead = rows.data.shape[:-1]  # cuBLASLt: [M, K] row-major x [K, N] column-major, scales [M, 1] and [1, N]
        y = torch._scaled_mm(rows.data.reshape(-1, self.in_features), self.weight.t(),
                             scale_a=rows.scale.reshape(-1, 1), scale_b=self.weight_scale[None],
                             bias=self.bias, out_dtype=rows.dtype)
        return y.reshape(*lead, self.out_features)


def use_fp8(model: nn.Module) -> nn.Module:
    """Replace each transformer layer's :data:`FP8_LINEARS` by :class:`Fp8Linear` (in place); returns model."""
    for block in model.blocks:
        for path in FP8_LINEARS:
            parent_path, _, name = path.rpartition(".")
            parent = block.get_submodule(parent_path)
            linear = getattr(parent, name)
            if linear.in_features % 16 or linear.out_features % 16:
                raise WanTrtError(f"fp8: {path} is {linear.in_features} -> {linear.out_features}; FP8 GEMMs need "
                                  "both multiples of 16 (this config's dim / ffn_dim): use --precision bf16")
            setattr(parent, name, Fp8Linear(linear))
    return model
