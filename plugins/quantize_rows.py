"""Per-row FP8 (e4m3) quantization on the GPU, optionally of tanh-GELU of the input:

    y = gelu_tanh(x) if gelu else x;  a = max(amax_row |y|, MIN_AMAX);  q = e4m3(y * (448 / a));  s = a / 448

An engine-only kernel of the fp8 precision (:mod:`wan_trt.model.fp8`): AOTInductor compiles it into
the package (``torch.ops.wan_trt.quantize_rows_fp8``, a ``triton_op``). One program per row, two
passes (the row's amax, then the quantization; the second read comes from L2). With ``gelu`` it
turns the FFN up-projection's output into the down-projection's FP8 input: 0.055 ms on an H100 for
[2640, 8960], where the graph compiler's own kernel for the same work took 0.083 (alone; 0.088 in
the engine). It is no TensorRT plugin: the ONNX graph holds plain Gelu and QuantizeLinear nodes.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch.library import triton_op, wrap_triton

from wan_trt.errors import WanTrtError
from wan_trt.model.fp8 import E4M3, E4M3_MAX, MIN_AMAX, reference_quantize_rows
from wan_trt.plugins.launch import INTERPRET

# the kernel's constants (a jitted function reads only constexpr globals)
SQRT_2_OVER_PI: tl.constexpr = tl.constexpr(0.7978845608028654)
E4M3_MAX_: tl.constexpr = tl.constexpr(E4M3_MAX)
MIN_AMAX_: tl.constexpr = tl.constexpr(MIN_AMAX)


def reference_quantize_rows_fp8(x: torch.Tensor, gelu: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """Pure PyTorch: (e4m3 [.., K], fp32 scale [.., 1]) of x, or of tanh-GELU(x) in fp32."""
    y = torch.nn.functional.gelu(x.float(), approximate="tanh") if gelu else x
    return reference_quantize_rows(y)


@triton.jit
def _round_e4m3(v):
    """v (fp32, |v| <= 448) rounded to the nearest e4m3 value, ties to even, in fp32 arithmetic: the
    cast that follows is then exact everywhere (Triton's interpreter rounds its own casts otherwise).
    The grid step is 2^(e - 3) for |v| in [2^e, 2^(e+1)), 2^-9 below e4m3's smallest normal 2^-6;
    t = |v| / step < 16 is rounded by adding and subtracting 2^23. Steps from the exponent bits."""
    a = tl.abs(v)
    exponent = tl.maximum(a.to(tl.int32, bitcast=True) & 0x7F800000, 121 << 23)  # 2^-6 and up
    step = (exponent - (3 << 23)).to(tl.float32, bitcast=True)  # 2^(e - 3)
    inverse = ((254 << 23) - exponent + (3 << 23)).to(tl.float32, bitcast=True)  # 2^(3 - e)
    t = (a * inverse + 8388608.0) - 8388608.0
    return tl.where(v < 0, -t * step, t * step)


@triton.jit
def _load(X, row, cols, mask, GELU: tl.constexpr):
    y = tl.load(X + row + cols, mask=mask, other=0.0).to(tl.float32)
    if GELU:  # 0.5 y (1 + tanh(u)) = y / (1 + exp(-2u)): no cancellation for negative y
        u = SQRT_2_OVER_PI * (y + 0.044715 * y * y * y)
        y = y / (1.0 + tl.exp(-2.0 * u))
    return y


def _configs():
    chunks_warps = [(256, 2)] if INTERPRET else [(1024, 4), (2048, 4), (2048, 8), (4096, 8)]
    return [triton.Config({"CHUNK": c}, num_warps=w, num_stages=1) for c, w in chunks_warps]


@triton.autotune(_configs(), key=["K", "GELU"])
@triton.jit
def _quantize_rows_fp8_kernel(X, Q, S, K, GELU: tl.constexpr, CHUNK: tl.constexpr):
    """One row per program, in chunks: a pass for the row's amax, a pass (from L2) to quantize."""
    row = tl.program_id(0).to(tl.int64) * K
    amax = tl.zeros([CHUNK], dtype=tl.float32)
    for k in range(0, K, CHUNK):
        cols = k + tl.arange(0, CHUNK)
        amax = tl.maximum(amax, tl.abs(_load(X, row, cols, cols < K, GELU)), propagate_nan=tl.PropagateNan.ALL)
    nan = tl.sum((amax != amax).to(tl.int32), 0) > 0  # tl.max drops NaN: a row with one has no scale
    amax = tl.where(nan, float("nan"), tl.maximum(tl.max(amax, 0), MIN_AMAX_))
    inverse = tl.math.div_rn(E4M3_MAX_, amax)  # as the reference: IEEE division, then one product each
    for k in range(0, K, CHUNK):
        cols = k + tl.arange(0, CHUNK)
        mask = cols < K
        q = _load(X, row, cols, mask, GELU) * inverse  # NaN where the row has a NaN or an Inf, as the reference
        q = tl.minimum(tl.maximum(q, -E4M3_MAX_, propagate_nan=tl.PropagateNan.ALL), E4M3_MAX_,
                       propagate_nan=tl.PropagateNan.ALL)
        tl.store(Q + row + cols, _round_e4m3(q).to(tl.float8e4nv), mask=mask)
    tl.store(S + tl.program_id(0), tl.math.div_rn(amax, E4M3_MAX_))


def quantize_rows_fp8(x: torch.Tensor, gelu: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """The kernel's launcher: x [.., K] contiguous."""
    if not x.is_contiguous():
        raise WanTrtError(f"quantize_rows_fp8: expected a contiguous input, got {list(x.shape)} with strides "
                          f"{list(x.stride())}")
    k = x.shape[-1]
    q = torch.empty(x.shape, dtype=E4M3, device=x.device)
    s = torch.empty((*x.shape[:-1], 1), dtype=torch.float32, device=x.device)
    wrap_triton(_quantize_rows_fp8_kernel)[(x.numel() // k,)](x, q, s, k, GELU=gelu)
    return q, s


@triton_op("wan_trt::quantize_rows_fp8", mutates_args={})
def _quantize_rows_fp8_op(x: torch.Tensor, gelu: bool) -> tuple[torch.Tensor, torch.Tensor]:
    return (reference_quantize_rows_fp8 if INTERPRET else quantize_rows_fp8)(x, gelu)


@_quantize_rows_fp8_op.register_kernel("cpu")
def _(x, gelu):
    return (quantize_rows_fp8 if INTERPRET else reference_quantize_rows_fp8)(x, gelu)
