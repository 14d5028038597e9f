"""The video decoder's norm: a causal convolution's bias, RMS norm over channels, SiLU, and the join
with the next convolution's history, in one pass over channels-last activations.

    norm_silu_join:      y = x + bias;                    joined = [history ; silu(norm(y) * gamma)]
    add_norm_silu_join:  y = x + bias + r (rounded: s);   returns (s, joined) with norm(s)
    split_norm_silu_join, split_add_norm_silu_join: the same of x = [x ; x_tail] along channels, read
        from the two outputs of a convolution computed as two (a 192-channel one as 128 + 64: cuDNN
        tiles output channels by 128), without joining them first

Activations are ``[B, C, T, H, W]`` tensors stored channels-last (``torch.channels_last_3d``: in
memory ``[B, T, H, W, C]``), as the engine's convolutions take and give them: x ``[B, Cx, T, H, W]``
(a convolution's output before its bias; Cx >= C: an engine's convolution may compute extra zero
channels, which are skipped), bias ``[Cx]``, r ``[B, C, T, H, W]``, gamma ``[C]``, history
``[B, C, 2, H, W]``, all activations of one dtype; joined ``[B, C, 2 + T, H, W]`` is the next
convolution's input. The outputs are allocated with explicit channels-last strides (why, and what
the AOTInductor build does about the convolutions they feed: docs/DESIGN.md, the decoder's engine
form). In a TensorRT engine the plugin's 5-D tensors are in the channels-last format (``DHWC``).
``norm(y) = y / max(|y|, 1e-12) * sqrt(C)`` (the decoder's ``RMS_norm``), in fp32. y stays fp32
(one rounding fewer than a convolution that adds its bias itself); s is rounded to the
activations' dtype, as it is stored.

One program handles ``BLOCK_R`` rows of joined, all of one frame: a program of history rows copies
them, one of activation rows normalises them (rows of both kinds in every program, each loading for
both, had run at 2.3-2.7 TB/s on an H200 where a copy of as many bytes runs at 4.3).
Every size is a compile-time constant: the decoder's shapes are static, and without
them Inductor's launch of the kernel ran 4x slower (no vectorised loads).
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch.library import wrap_triton

from wan_trt.errors import WanTrtError
from wan_trt.model.vae import channels_last_3d_strides
from wan_trt.plugins.aot import Plan, TensorArg, compile_ptx
from wan_trt.plugins.launch import rows_launch

HISTORY = 2  # frames of history before the activations (the kernels' T + 2)
CHANNELS_LAST = torch.channels_last_3d


def _joined(history: torch.Tensor, y: torch.Tensor, gamma: torch.Tensor) -> torch.Tensor:
    """[history ; silu(norm(y) * gamma)] along time, channels-last."""
    c = gamma.shape[0]
    h = torch.nn.functional.normalize(y.float(), dim=1) * c ** 0.5 * gamma.float().view(-1, 1, 1, 1)
    h = torch.nn.functional.silu(h).to(history.dtype)
    return torch.cat([history, h], dim=2).contiguous(memory_format=CHANNELS_LAST)


def _biased(x: torch.Tensor, bias: torch.Tensor, c: int) -> torch.Tensor:
    return x[:, :c].float() + bias[:c].float().view(-1, 1, 1, 1)


def reference_norm_silu_join(x: torch.Tensor, bias: torch.Tensor, gamma: torch.Tensor, history: torch.Tensor
                             ) -> torch.Tensor:
    """Pure PyTorch: fp32 (x + bias), norm and SiLU, after the history."""
    return _joined(history, _biased(x, bias, gamma.shape[0]), gamma)


def reference_add_norm_silu_join(x: torch.Tensor, bias: torch.Tensor, r: torch.Tensor, gamma: torch.Tensor,
                                 history: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Pure PyTorch: s = x + bias + r in the activations' dtype, then as :func:`reference_norm_silu_join` of s."""
    s = (_biased(x, bias, gamma.shape[0]) + r.float()).to(r.dtype)
    return s.contiguous(memory_format=CHANNELS_LAST), _joined(history, s, gamma)


def reference_split_norm_silu_join(x: torch.Tensor, x_tail: torch.Tensor, bias: torch.Tensor, gamma: torch.Tensor,
                                   history: torch.Tensor) -> torch.Tensor:
    """Pure PyTorch: :func:`reference_norm_silu_join` of [x ; x_tail] (channels)."""
    return reference_norm_silu_join(torch.cat([x, x_tail], dim=1), bias, gamma, history)


def reference_split_add_norm_silu_join(x: torch.Tensor, x_tail: torch.Tensor, bias: torch.Tensor, r: torch.Tensor,
                                       gamma: torch.Tensor, history: torch.Tensor
                                       ) -> tuple[torch.Tensor, torch.Tensor]:
    """Pure PyTorch: :func:`reference_add_norm_silu_join` of [x ; x_tail] (channels)."""
    return reference_add_norm_silu_join(torch.cat([x, x_tail], dim=1), bias, r, gamma, history)


@triton.jit
def _block(T: tl.constexpr, HW: tl.constexpr, ROWS: tl.constexpr, C: tl.constexpr, BLOCK_R: tl.constexpr,
           BLOCK_C: tl.constexpr):
    """This program's rows of joined, all of one frame (HW is a multiple of BLOCK_R): (rows, their mask with the
    channels', the channels, their mask, whether they are history rows, their history rows, their activation
    rows). Each [B, 2 + T] frames of joined starts with the 2 history frames (HISTORY)."""
    row0 = tl.program_id(0) * BLOCK_R
    b = row0 // (HW * (T + 2))
    rows = row0 + tl.arange(0, BLOCK_R)
    cols = tl.arange(0, BLOCK_C)
    cmask = cols < C
    m = (rows < ROWS)[:, None] & cmask[None, :]
    return rows, m, cols, cmask, (row0 // HW) % (T + 2) < 2, rows - b * T * HW, rows - 2 * HW * (b + 1)


@triton.jit
def _copy_history(H, J, rows, hrow, cols, m, C: tl.constexpr):
    """joined's history rows: the history's, as they are."""
    tl.store(J + rows[:, None] * C + cols[None, :], tl.load(H + hrow[:, None] * C + cols[None, :], mask=m), mask=m)


@triton.jit
def _norm_silu(y, rows, cols, cmask, m, G, J, C: tl.constexpr):
    """joined's activation rows: silu(norm(y) * gamma)."""
    g = tl.load(G + cols, mask=cmask, other=0.0).to(tl.float32)
    scale = tl.sqrt(C * 1.0) / tl.maximum(tl.sqrt(tl.sum(y * y, 1)), 1e-12)
    h = y * scale[:, None] * g[None, :]
    h = h * tl.sigmoid(h)
    tl.store(J + rows[:, None] * C + cols[None, :], h.to(J.dtype.element_ty), mask=m)


@triton.jit
def _load_biased(X, XB, xrow, xm, cols, cmask, CX: tl.constexpr):
    """x + bias on the activation rows ``xm`` selects (fp32; 0 elsewhere). It returns one value: Inductor's
    mutation analysis takes every pointer passed to a helper that returns several for written."""
    y = tl.load(X + xrow[:, None] * CX + cols[None, :], mask=xm, other=0.0).to(tl.float32)
    return y + tl.load(XB + cols, mask=cmask, other=0.0).to(tl.float32)[None, :]


@triton.jit
def _load_split_biased(X, X2, XB, xrow, xm, cols, cmask, CX: tl.constexpr, CX2: tl.constexpr):
    """As :func:`_load_biased`, of x's channels [0, CX) from X and [CX, CX + CX2) from X2."""
    head = (cols < CX)[None, :]
    y = tl.load(X + xrow[:, None] * CX + cols[None, :], mask=xm & head, other=0.0).to(tl.float32)
    y += tl.load(X2 + xrow[:, None] * CX2 + (cols - CX)[None, :], mask=xm & ~head, other=0.0).to(tl.float32)
    return y + tl.load(XB + cols, mask=cmask, other=0.0).to(tl.float32)[None, :]


@triton.jit
def _add_residual(y, R, S, xrow, cols, m, C: tl.constexpr):
    """s = y + r, rounded to the activations' dtype and stored; returned in fp32 (the norm reads it as stored)."""
    s = (y + tl.load(R + xrow[:, None] * C + cols[None, :], mask=m, other=0.0).to(tl.float32)).to(S.dtype.element_ty)
    tl.store(S + xrow[:, None] * C + cols[None, :], s, mask=m)
    return s.to(tl.float32)


@triton.jit
def _norm_silu_join_kernel(X, XB, G, H,  # inputs, then the output
                           J,
                           T: tl.constexpr, HW: tl.constexpr, ROWS: tl.constexpr, C: tl.constexpr,
                           CX: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_C: tl.constexpr):
    rows, m, cols, cmask, history, hrow, xrow = _block(T, HW, ROWS, C, BLOCK_R, BLOCK_C)
    if history:
        _copy_history(H, J, rows, hrow, cols, m, C)
    else:
        _norm_silu(_load_biased(X, XB, xrow, m, cols, cmask, CX), rows, cols, cmask, m, G, J, C)


@triton.jit
def _add_norm_silu_join_kernel(X, XB, R, G, H,  # inputs, then the outputs
                               S, J,
                               T: tl.constexpr, HW: tl.constexpr, ROWS: tl.constexpr, C: tl.constexpr,
                               CX: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_C: tl.constexpr):
    rows, m, cols, cmask, history, hrow, xrow = _block(T, HW, ROWS, C, BLOCK_R, BLOCK_C)
    if history:
        _copy_history(H, J, rows, hrow, cols, m, C)
    else:
        s = _add_residual(_load_biased(X, XB, xrow, m, cols, cmask, CX), R, S, xrow, cols, m, C)
        _norm_silu(s, rows, cols, cmask, m, G, J, C)


@triton.jit
def _split_norm_silu_join_kernel(X, X2, XB, G, H,  # inputs, then the output
                                 J,
                                 T: tl.constexpr, HW: tl.constexpr, ROWS: tl.constexpr, C: tl.constexpr,
                                 CX: tl.constexpr, CX2: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_C: tl.constexpr):
    rows, m, cols, cmask, history, hrow, xrow = _block(T, HW, ROWS, C, BLOCK_R, BLOCK_C)
    if history:
        _copy_history(H, J, rows, hrow, cols, m, C)
    else:
        _norm_silu(_load_split_biased(X, X2, XB, xrow, m, cols, cmask, CX, CX2), rows, cols, cmask, m, G, J, C)


@triton.jit
def _split_add_norm_silu_join_kernel(X, X2, XB, R, G, H,  # inputs, then the outputs
                                     S, J,
                                     T: tl.constexpr, HW: tl.constexpr, ROWS: tl.constexpr, C: tl.constexpr,
                                     CX: tl.constexpr, CX2: tl.constexpr, BLOCK_R: tl.constexpr,
                                     BLOCK_C: tl.constexpr):
    rows, m, cols, cmask, history, hrow, xrow = _block(T, HW, ROWS, C, BLOCK_R, BLOCK_C)
    if history:
        _copy_history(H, J, rows, hrow, cols, m, C)
    else:
        s = _add_residual(_load_split_biased(X, X2, XB, xrow, m, cols, cmask, CX, CX2), R, S, xrow, cols, m, C)
        _norm_silu(s, rows, cols, cmask, m, G, J, C)


def _sizes(op: str, x, bias, r, gamma, history, x_tail=None) -> dict[str, int]:
    """The kernels' compile-time sizes; checks the shapes (tuples, so plans and launchers share it).
    ``x_tail``: the split ops' second part of x (Cx2 channels: C > Cx, bias [Cx + Cx2])."""
    split = x_tail is not None
    expected = ("x [B, Cx, T, H, W], x_tail [B, Cx2, T, H, W], bias [Cx + Cx2], gamma [Cx < C <= Cx + Cx2]" if split
                else "x [B, Cx, T, H, W], bias [Cx], gamma [C <= Cx]") + ", history [B, C, 2, H, W]" + (
        ", r [B, C, T, H, W]" if r is not None else "")
    got = f"x {tuple(x)}, " + (f"x_tail {tuple(x_tail)}, " if split else "") + \
        f"bias {tuple(bias)}, gamma {tuple(gamma)}, history {tuple(history)}" + (f", r {tuple(r)}" if r is not None else "")
    if len(x) != 5 or len(gamma) != 1 or (split and len(x_tail) != 5):
        raise WanTrtError(f"{op}: expected {expected}; got {got}")
    b, cx, t, h, w = x
    c, cx2 = gamma[0], x_tail[1] if split else 0
    if tuple(bias) != (cx + cx2,) or not (cx < c <= cx + cx2 if split else c <= cx) \
            or (split and tuple(x_tail) != (b, cx2, t, h, w)) or tuple(history) != (b, c, HISTORY, h, w) \
            or (r is not None and tuple(r) != (b, c, t, h, w)):
        raise WanTrtError(f"{op}: expected {expected}; got {got}")
    rows = b * (t + HISTORY) * h * w
    if rows * max(cx, cx2, c) >= 2 ** 31:
        raise WanTrtError(f"{op}: {tuple(x)} is too large for 32-bit offsets")
    return {"T": t, "HW": h * w, "ROWS": rows, "C": c, "CX": cx, **({"CX2": cx2} if split else {})}


def _empty(shape, like: torch.Tensor) -> torch.Tensor:
    """A channels-last buffer allocated with its strides (``empty_strided``, not a permuted view)."""
    return torch.empty_strided(shape, channels_last_3d_strides(shape), dtype=like.dtype, device=like.device)


def _check_tensors(op: str, activations: dict[str, torch.Tensor], vectors: dict[str, torch.Tensor]) -> None:
    """Activations channels-last and of one dtype, vectors contiguous."""
    for name, t in activations.items():
        if not t.is_contiguous(memory_format=CHANNELS_LAST):
            raise WanTrtError(f"{op}: {name} must be channels-last [B, C, T, H, W] (torch.channels_last_3d)")
    for name, t in vectors.items():
        if not t.is_contiguous():
            raise WanTrtError(f"{op}: {name} must be contiguous")
    dtypes = {name: t.dtype for name, t in activations.items()}
    if len(set(dtypes.values())) > 1:
        raise WanTrtError(f"{op}: the activations must share one dtype; got {dtypes}")


def _launch(op: str, kernel, x: torch.Tensor, x_tail: torch.Tensor | None, bias: torch.Tensor,
            r: torch.Tensor | None, gamma: torch.Tensor, history: torch.Tensor):
    """Checks the arguments of ``op`` and runs its kernel: joined, or (s, joined) with ``r``. The split
    ops pass ``x_tail``, the adding ones ``r``."""
    sizes = _sizes(op, x.shape, bias.shape, None if r is None else r.shape, gamma.shape, history.shape,
                   None if x_tail is None else x_tail.shape)
    activations = {name: t for name, t in (("x", x), ("x_tail", x_tail), ("r", r), ("history", history))
                   if t is not None}
    _check_tensors(op, activations, {"bias": bias, "gamma": gamma})
    b, _, t, h, w = x.shape
    s = None if r is None else _empty(r.shape, r)
    joined = _empty((b, sizes["C"], t + HISTORY, h, w), history)
    inputs = [a for a in (x, x_tail, bias, r, gamma, history) if a is not None]
    launch = rows_launch(sizes["C"], sizes["HW"])
    wrap_triton(kernel)[(triton.cdiv(sizes["ROWS"], launch.blocks["BLOCK_R"]),)](
        *inputs, *([joined] if s is None else [s, joined]), **sizes, **launch.kwargs())
    return joined if s is None else (s, joined)


def _plan(op: str, kernel, x: TensorArg, x_tail: TensorArg | None, bias: TensorArg, r: TensorArg | None,
          gamma: TensorArg, history: TensorArg, arch: int | None) -> Plan:
    """The TensorRT plan of ``op`` (5-D tensors in the DHWC format), for the current GPU or compute
    capability ``arch``; arguments as :func:`_launch`'s."""
    sizes = _sizes(op, x.shape, bias.shape, None if r is None else r.shape, gamma.shape, history.shape,
                   None if x_tail is None else x_tail.shape)
    launch = rows_launch(sizes["C"], sizes["HW"])
    pointers = {name: a.dtype for name, a in (("X", x), ("X2", x_tail), ("XB", bias), ("R", r), ("G", gamma),
                                             ("H", history)) if a is not None}
    outputs = {"J": history.dtype} if r is None else {"S": r.dtype, "J": history.dtype}
    compiled = compile_ptx(kernel, pointers, {}, outputs, sizes, launch, arch)
    return Plan(compiled, (triton.cdiv(sizes["ROWS"], launch.blocks["BLOCK_R"]),), [])


def norm_silu_join(x: torch.Tensor, bias: torch.Tensor, gamma: torch.Tensor, history: torch.Tensor) -> torch.Tensor:
    """[history ; silu(norm(x + bias) * gamma)] in one pass (Triton)."""
    return _launch("norm_silu_join", _norm_silu_join_kernel, x, None, bias, None, gamma, history)


def add_norm_silu_join(x: torch.Tensor, bias: torch.Tensor, r: torch.Tensor, gamma: torch.Tensor,
                       history: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(s = x + bias + r, [history ; silu(norm(s) * gamma)]) in one pass (Triton)."""
    return _launch("add_norm_silu_join", _add_norm_silu_join_kernel, x, None, bias, r, gamma, history)


def split_norm_silu_join(x: torch.Tensor, x_tail: torch.Tensor, bias: torch.Tensor, gamma: torch.Tensor,
                         history: torch.Tensor) -> torch.Tensor:
    """[history ; silu(norm([x ; x_tail] + bias) * gamma)] in one pass (Triton)."""
    return _launch("split_norm_silu_join", _split_norm_silu_join_kernel, x, x_tail, bias, None, gamma, history)


def split_add_norm_silu_join(x: torch.Tensor, x_tail: torch.Tensor, bias: torch.Tensor, r: torch.Tensor,
                             gamma: torch.Tensor, history: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(s = [x ; x_tail] + bias + r, [history ; silu(norm(s) * gamma)]) in one pass (Triton)."""
    return _launch("split_add_norm_silu_join", _split_add_norm_silu_join_kernel, x, x_tail, bias, r, gamma, history)


def norm_silu_join_plan(x: TensorArg, bias: TensorArg, gamma: TensorArg, history: TensorArg, *, tactic: int = 0,
                        arch: int | None = None) -> Plan:
    """The TensorRT plan (5-D tensors in the DHWC format), for the current GPU or compute capability ``arch``."""
    return _plan("norm_silu_join", _norm_silu_join_kernel, x, None, bias, None, gamma, history, arch)


def add_norm_silu_join_plan(x: TensorArg, bias: TensorArg, r: TensorArg, gamma: TensorArg, history: TensorArg, *,
                            tactic: int = 0, arch: int | None = None) -> Plan:
    """The TensorRT plan (5-D tensors in the DHWC format), for the current GPU or compute capability ``arch``."""
    return _plan("add_norm_silu_join", _add_norm_silu_join_kernel, x, None, bias, r, gamma, history, arch)


def split_norm_silu_join_plan(x: TensorArg, x_tail: TensorArg, bias: TensorArg, gamma: TensorArg, history: TensorArg,
                              *, tactic: int = 0, arch: int | None = None) -> Plan:
    """The TensorRT plan (5-D tensors in the DHWC format), for the current GPU or compute capability ``arch``."""
    return _plan("split_norm_silu_join", _split_norm_silu_join_kernel, x, x_tail, bias, None, gamma, history, arch)


def split_add_norm_silu_join_plan(x: TensorArg, x_tail: TensorArg, bias: TensorArg, r: TensorArg, gamma: TensorArg,
                                  history: TensorArg, *, tactic: int = 0, arch: int | None = None) -> Plan:
    """The TensorRT plan (5-D tensors in the DHWC format), for the current GPU or compute capability ``arch``."""
    return _plan("split_add_norm_silu_join", _split_add_norm_silu_join_kernel, x, x_tail, bias, r, gamma, history,
                 arch)
