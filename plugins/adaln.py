"""adaLN norm: LayerNorm (no affine, fp32 statistics) + per-frame modulation, optionally fused
with the residual add that precedes it.

    adaln:      h = LN(x) * a[f] + c[f]
    add_adaln:  x' = x + y * g[f];   h = LN(x') * a[f] + c[f];   returns (x', h)

For the modulated norms a = 1 + scale, c = shift; for the affine norm3 a = weight,
c = bias (frame stride 0). f = token // S is the token's latent frame. x: [B, L, C]
(the residual stream), y: [B, L, C]; a, c, g: [B, F, C] or [C]. x' keeps x's dtype,
h takes ``out_dtype``, by default a's (the modulation's: the sublayer's compute dtype).
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch.library import wrap_triton

from wan_trt.errors import WanTrtError
from wan_trt.plugins.aot import Plan, TensorArg, compile_ptx
from wan_trt.plugins.launch import row_launch


def _frames(t: torch.Tensor, frames: int) -> torch.Tensor:
    return t.reshape(1, 1, -1) if t.ndim == 1 else t.reshape(t.shape[0], frames, -1)


def reference_adaln(x: torch.Tensor, a: torch.Tensor, c: torch.Tensor, frames: int, eps: float,
                    out_dtype: torch.dtype | None = None) -> torch.Tensor:
    """Pure PyTorch: fp32 LayerNorm then per-frame modulation; h in ``out_dtype``, defaults to a's dtype."""
    xf = x.float().unflatten(1, (frames, -1))
    h = torch.nn.functional.layer_norm(xf, xf.shape[-1:], eps=eps)
    h = h * _frames(a, frames).float()[:, :, None] + _frames(c, frames).float()[:, :, None]
    return h.flatten(1, 2).to(out_dtype or a.dtype)


def reference_add_adaln(x: torch.Tensor, y: torch.Tensor, g: torch.Tensor, a: torch.Tensor, c: torch.Tensor,
                        frames: int, eps: float, out_dtype: torch.dtype | None = None
                        ) -> tuple[torch.Tensor, torch.Tensor]:
    """Pure PyTorch: gated residual rounded to x's dtype, then :func:`reference_adaln`."""
    yf = y.float().unflatten(1, (frames, -1)) * _frames(g, frames).float()[:, :, None]
    x_new = (x.float() + yf.flatten(1, 2)).to(x.dtype)
    return x_new, reference_adaln(x_new, a, c, frames, eps, out_dtype)


@triton.jit
def _ln_modulate(x, A, Cb, b, f, cols, mask, C, stride_ab, stride_af, stride_cb, stride_cf, eps: tl.constexpr):
    """One row: fp32 LayerNorm of x (masked to C columns), times a[f], plus c[f]."""
    mean = tl.sum(x, 0) / C
    centered = tl.where(mask, x - mean, 0.0)
    rstd = tl.math.rsqrt(tl.sum(centered * centered, 0) / C + eps)
    a = tl.load(A + b * stride_ab + f * stride_af + cols, mask=mask, other=0.0).to(tl.float32)
    c = tl.load(Cb + b * stride_cb + f * stride_cf + cols, mask=mask, other=0.0).to(tl.float32)
    return centered * rstd * a + c


@triton.jit
def _adaln_kernel(X, A, Cb,  # inputs, then int32 scalars, then the output
                  L, C, tokens_per_frame, stride_ab, stride_af, stride_cb, stride_cf,
                  HO,
                  eps: tl.constexpr, BLOCK_C: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK_C)
    mask = cols < C
    x = tl.load(X + row * C + cols, mask=mask, other=0.0).to(tl.float32)
    h = _ln_modulate(x, A, Cb, row // L, (row % L) // tokens_per_frame, cols, mask, C, stride_ab, stride_af,
                     stride_cb, stride_cf, eps)
    tl.store(HO + row * C + cols, h.to(HO.dtype.element_ty), mask=mask)


@triton.jit
def _add_adaln_kernel(X, Y, G, A, Cb,  # inputs, then int32 scalars, then the outputs
                      L, C, tokens_per_frame, stride_gb, stride_gf, stride_ab, stride_af, stride_cb, stride_cf,
                      XO, HO,
                      eps: tl.constexpr, BLOCK_C: tl.constexpr):
    row = tl.program_id(0)
    b = row // L
    f = (row % L) // tokens_per_frame
    cols = tl.arange(0, BLOCK_C)
    mask = cols < C
    x = tl.load(X + row * C + cols, mask=mask, other=0.0).to(tl.float32)
    y = tl.load(Y + row * C + cols, mask=mask, other=0.0).to(tl.float32)
    g = tl.load(G + b * stride_gb + f * stride_gf + cols, mask=mask, other=0.0).to(tl.float32)
    x = (x + y * g).to(XO.dtype.element_ty)
    tl.store(XO + row * C + cols, x, mask=mask)
    h = _ln_modulate(x.to(tl.float32), A, Cb, b, f, cols, mask, C, stride_ab, stride_af, stride_cb, stride_cf, eps)
    tl.store(HO + row * C + cols, h.to(HO.dtype.element_ty), mask=mask)


def _frame_strides(t: torch.Tensor, frames: int) -> tuple[int, int]:
    """(batch, frame) strides of a per-frame [B, F, C] tensor, 0 for a broadcast [C] vector."""
    if t.ndim == 1:
        return 0, 0
    t = t.reshape(t.shape[0], frames, -1)
    return t.stride(0), t.stride(1)


def _check(x, y, g, a, c, frames):
    length, width = x.shape[1], x.shape[2]
    if length % frames:
        raise WanTrtError(f"adaln: {length} tokens do not split into {frames} frames")
    for name, t in (("x", x), ("y", y)):
        if t is not None and (not t.is_contiguous() or t.shape != x.shape):
            raise WanTrtError(f"adaln: {name} must be contiguous {tuple(x.shape)}, got {tuple(t.shape)}")
    for name, t in (("gate", g), ("a", a), ("c", c)):
        if t is not None and (t.shape[-1] != width or t.stride(-1) != 1
                              or t.numel() not in (width, x.shape[0] * frames * width)):
            raise WanTrtError(f"adaln: {name} must be [B, F, C] or [C] with C = {width}, got {tuple(t.shape)}")


def adaln(x: torch.Tensor, a: torch.Tensor, c: torch.Tensor, frames: int, eps: float,
          out_dtype: torch.dtype | None = None) -> torch.Tensor:
    """h = LN(x) * a[f] + c[f] (Triton); h in ``out_dtype``, defaults to a's dtype."""
    _check(x, None, None, a, c, frames)
    b, length, width = x.shape
    h = torch.empty(x.shape, dtype=out_dtype or a.dtype, device=x.device)
    wrap_triton(_adaln_kernel)[(b * length,)](x, a, c, length, width, length // frames, *_frame_strides(a, frames),
                                              *_frame_strides(c, frames), h, eps=eps,
                                              **row_launch("BLOCK_C", width).kwargs())
    return h


def add_adaln(x: torch.Tensor, y: torch.Tensor, g: torch.Tensor, a: torch.Tensor, c: torch.Tensor,
              frames: int, eps: float, out_dtype: torch.dtype | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """(x + y * g[f], LN(x + y * g[f]) * a[f] + c[f]) in one pass (Triton); h in ``out_dtype``, defaults
    to a's dtype."""
    _check(x, y, g, a, c, frames)
    b, length, width = x.shape
    x_new = torch.empty_like(x)
    h = torch.empty(x.shape, dtype=out_dtype or a.dtype, device=x.device)
    wrap_triton(_add_adaln_kernel)[(b * length,)](
        x, y, g, a, c, length, width, length // frames, *_frame_strides(g, frames), *_frame_strides(a, frames),
        *_frame_strides(c, frames), x_new, h, eps=eps, **row_launch("BLOCK_C", width).kwargs())
    return x_new, h


def _plan_strides(t: TensorArg, frames: int) -> tuple[int, int]:
    """(batch, frame) strides of a contiguous per-frame [B, F, 1, C] tensor; (0, 0) for a broadcast [C]."""
    return (0, 0) if len(t.shape) == 1 else (frames * t.shape[-1], t.shape[-1])


def adaln_plan(x: TensorArg, a: TensorArg, c: TensorArg, frames: int, eps: float, *, tactic: int = 0,
               arch: int | None = None) -> Plan:
    """The TensorRT plan of a contiguous x [B, L, C], for the current GPU or compute capability ``arch``."""
    b, length, width = x.shape
    scalars = {"L": length, "C": width, "tokens_per_frame": length // frames}
    scalars |= dict(zip(("stride_ab", "stride_af", "stride_cb", "stride_cf"),
                        _plan_strides(a, frames) + _plan_strides(c, frames)))
    compiled = compile_ptx(_adaln_kernel, {"X": x.dtype, "A": a.dtype, "Cb": c.dtype}, scalars, {"HO": a.dtype},
                           {"eps": eps}, row_launch("BLOCK_C", width), arch)
    return Plan(compiled, (b * length,), list(scalars.values()))


def add_adaln_plan(x: TensorArg, y: TensorArg, g: TensorArg, a: TensorArg, c: TensorArg, frames: int, eps: float,
                   *, tactic: int = 0, arch: int | None = None) -> Plan:
    """The TensorRT plan of contiguous x, y [B, L, C], for the current GPU or compute capability ``arch``."""
    b, length, width = x.shape
    scalars = {"L": length, "C": width, "tokens_per_frame": length // frames}
    scalars |= dict(zip(("stride_gb", "stride_gf", "stride_ab", "stride_af", "stride_cb", "stride_cf"),
                        _plan_strides(g, frames) + _plan_strides(a, frames) + _plan_strides(c, frames)))
    compiled = compile_ptx(_add_adaln_kernel, {"X": x.dtype, "Y": y.dtype, "G": g.dtype, "A": a.dtype, "Cb": c.dtype},
                           scalars, {"XO": x.dtype, "HO": a.dtype}, {"eps": eps}, row_launch("BLOCK_C", width), arch)
    return Plan(compiled, (b * length,), list(scalars.values()))
