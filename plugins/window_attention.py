"""Window attention: the block's queries over [valid previous-frame keys ; current keys].

    out[m] = sum_n softmax_n(q[m] . k[n] / sqrt(D)) v[n],  n over
        prev keys [first_valid, P*S)  with first_valid = (P - valid_frames) * S
        cur keys  [0, F*S)

without concatenating prev and cur (two key segments, one online softmax), in the exp2
form: scores are multiplied by log2(e)/sqrt(D) and exponentiated with exp2. bf16/fp16
in and out, fp32 accumulation. ``valid_frames`` is read on the device (no host sync).

Shapes: q, k_cur, v_cur [B, Lq, H, D]; k_prev, v_prev [B, P*S, H, D]; valid_frames int32 [1].
"""
from __future__ import annotations

import math

import torch
import triton
import triton.language as tl
from torch.library import wrap_triton

from wan_trt.errors import WanTrtError
from wan_trt.plugins.aot import Plan, TensorArg, compile_ptx
from wan_trt.plugins.launch import GPU_TILINGS, INTERPRET, INTERPRETER_TILINGS, Tiling, tiling_launch

LOG2E = 1.4426950408889634


def reference_window_attention(q: torch.Tensor, k_prev: torch.Tensor, v_prev: torch.Tensor, k_cur: torch.Tensor,
                               v_cur: torch.Tensor, valid_frames: torch.Tensor, prev_frames: int,
                               units: int) -> torch.Tensor:
    """Pure PyTorch (fp32 math): concatenate, mask the invalid previous frames, softmax."""
    k = torch.cat([k_prev, k_cur], dim=1).float()
    v = torch.cat([v_prev, v_cur], dim=1).float()
    first_valid = (prev_frames - valid_frames.to(torch.int64)) * units
    slots = torch.arange(k.shape[1], device=q.device)
    valid = (slots >= first_valid.to(q.device)) | (slots >= k_prev.shape[1])
    scores = torch.einsum("bqhd,bkhd->bhqk", q.float(), k) / math.sqrt(q.shape[-1])
    scores = scores.masked_fill(~valid, float("-inf"))
    return torch.einsum("bhqk,bkhd->bqhd", scores.softmax(-1), v).to(q.dtype)


@triton.jit
def _attend_block(acc, l_i, m_i, q, k_base, v_base, stride_kn, start_n, hi, offs_d, qk_scale,
                  BLOCK_N: tl.constexpr, DOT_PRECISION: tl.constexpr, MASKED: tl.constexpr):
    """Online-softmax update of (acc, l, m) with keys/values [start_n, start_n + BLOCK_N) (cut at hi if MASKED)."""
    offs_n = start_n + tl.arange(0, BLOCK_N)
    offs = offs_n[:, None] * stride_kn + offs_d[None, :]
    if MASKED:
        in_range = offs_n < hi
        k = tl.load(k_base + offs, mask=in_range[:, None], other=0.0)
        v = tl.load(v_base + offs, mask=in_range[:, None], other=0.0)
    else:
        k = tl.load(k_base + offs)
        v = tl.load(v_base + offs)
    qk = tl.dot(q, tl.trans(k), input_precision=DOT_PRECISION)
    if MASKED:
        qk = tl.where(in_range[None, :], qk, float("-inf"))
    m_new = tl.maximum(m_i, tl.max(qk, 1) * qk_scale)
    p = tl.math.exp2(qk * qk_scale - m_new[:, None])  # one FMA per score
    alpha = tl.math.exp2(m_i - m_new)
    acc = tl.dot(p.to(v.dtype), v, acc * alpha[:, None], input_precision=DOT_PRECISION)
    return acc, l_i * alpha + tl.sum(p, 1), m_new


@triton.jit
def _attend_segment(acc, l_i, m_i, q, k_base, v_base, stride_kn, lo, hi, offs_d, qk_scale,
                    BLOCK_N: tl.constexpr, TAIL_N: tl.constexpr, DOT_PRECISION: tl.constexpr):
    """Keys/values [lo, hi) of one segment: whole blocks without masks, then the rest in masked
    blocks of TAIL_N keys (narrower than BLOCK_N: less work wasted on keys past hi)."""
    full_end = lo + (hi - lo) // BLOCK_N * BLOCK_N
    for start_n in range(lo, full_end, BLOCK_N):
        acc, l_i, m_i = _attend_block(acc, l_i, m_i, q, k_base, v_base, stride_kn, start_n, hi, offs_d, qk_scale,
                                      BLOCK_N, DOT_PRECISION, False)
    for start_n in range(full_end, hi, TAIL_N):
        acc, l_i, m_i = _attend_block(acc, l_i, m_i, q, k_base, v_base, stride_kn, start_n, hi, offs_d, qk_scale,
                                      TAIL_N, DOT_PRECISION, True)
    return acc, l_i, m_i


@triton.jit
def _window_attention_kernel(Q, KP, VP, KC, VC, Valid,  # inputs, then int32 scalars, then the output
                             stride_qb, stride_qm, stride_qh,
                             stride_pb, stride_pn, stride_ph,
                             stride_cb, stride_cn, stride_ch,
                             stride_ob, stride_om, stride_oh,
                             Lq, n_prev, n_cur, H, prev_frames, units,
                             Out,
                             qk_scale: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr,
                             BLOCK_N: tl.constexpr, TAIL_N: tl.constexpr, DOT_PRECISION: tl.constexpr):
    pid_m = tl.program_id(0)
    pid_bh = tl.program_id(1)
    b = pid_bh // H
    h = pid_bh % H
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, HEAD_DIM)
    q = tl.load(Q + b * stride_qb + h * stride_qh + offs_m[:, None] * stride_qm + offs_d[None, :],
                mask=offs_m[:, None] < Lq, other=0.0)
    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, HEAD_DIM], tl.float32)
    if n_prev > 0:
        first_valid = tl.minimum(tl.maximum((prev_frames - tl.load(Valid)) * units, 0), n_prev)
        acc, l_i, m_i = _attend_segment(acc, l_i, m_i, q, KP + b * stride_pb + h * stride_ph,
                                        VP + b * stride_pb + h * stride_ph, stride_pn, first_valid, n_prev,
                                        offs_d, qk_scale, BLOCK_N, TAIL_N, DOT_PRECISION)
    acc, l_i, m_i = _attend_segment(acc, l_i, m_i, q, KC + b * stride_cb + h * stride_ch,
                                    VC + b * stride_cb + h * stride_ch, stride_cn, 0, n_cur, offs_d, qk_scale,
                                    BLOCK_N, TAIL_N, DOT_PRECISION)
    out = acc / l_i[:, None]
    tl.store(Out + b * stride_ob + h * stride_oh + offs_m[:, None] * stride_om + offs_d[None, :],
             out.to(Out.dtype.element_ty), mask=offs_m[:, None] < Lq)


def tiling_config(t: Tiling) -> triton.Config:
    """The Triton config of a tiling (:func:`~wan_trt.plugins.launch.tiling_launch` checks its sizes)."""
    launch = tiling_launch(t)
    return triton.Config(launch.blocks, num_warps=launch.num_warps, num_stages=launch.num_stages)


def autotune_configs():
    return [tiling_config(t) for t in (INTERPRETER_TILINGS if INTERPRET else GPU_TILINGS)]


window_attention_kernel = triton.autotune(autotune_configs(), key=["Lq", "n_prev", "n_cur", "HEAD_DIM"])(
    _window_attention_kernel)


def dot_precision(dtype: torch.dtype) -> str:
    """fp32 inputs multiply exactly ('ieee'), not in TF32; bf16/fp16 use the tensor cores as they are."""
    return "ieee" if dtype == torch.float32 else "tf32"


def check_attention_inputs(op: str, q, k_prev, v_prev, k_cur, v_cur, valid_frames, min_head_dim: int) -> None:
    """What the attention kernels over [previous ; current] keys need, as clear errors: the dtype, a
    power-of-two head dim, segments that match q, unit last strides, an int32 ``valid_frames``."""
    if q.dtype not in (torch.bfloat16, torch.float16, torch.float32):
        raise WanTrtError(f"{op}: dtype {q.dtype} not supported (bf16, fp16, fp32)")
    d = q.shape[-1]
    if d < min_head_dim or d > 256 or d & (d - 1):
        raise WanTrtError(f"{op}: head_dim {d} must be a power of two in [{min_head_dim}, 256]")
    for name, t in (("k_prev", k_prev), ("v_prev", v_prev), ("k_cur", k_cur), ("v_cur", v_cur)):
        if t.dtype != q.dtype or t.shape[0] != q.shape[0] or t.shape[2:] != q.shape[2:] or t.stride(-1) != 1:
            raise WanTrtError(f"{op}: {name} {tuple(t.shape)} {t.dtype} does not match q "
                              f"{tuple(q.shape)} {q.dtype} (or its last dim is strided)")
    if k_cur.shape[1] != v_cur.shape[1] or k_prev.shape[1] != v_prev.shape[1] or q.stride(-1) != 1:
        raise WanTrtError(f"{op}: k/v lengths differ or q's last dim is strided")
    if valid_frames.numel() != 1 or valid_frames.dtype != torch.int32:
        raise WanTrtError(f"{op}: valid_frames must be an int32 tensor of one element")


def check_window_attention(q, k_prev, v_prev, k_cur, v_cur, valid_frames) -> None:
    """The launcher's limits, as clear errors."""
    check_attention_inputs("window_attention", q, k_prev, v_prev, k_cur, v_cur, valid_frames, min_head_dim=16)
    for name, k, v in (("prev", k_prev, v_prev), ("cur", k_cur, v_cur)):  # the kernel reads v with k's strides
        if v.numel() and any(n > 1 and sk != sv for n, sk, sv in zip(k.shape, k.stride(), v.stride())):
            raise WanTrtError(f"window_attention: v_{name} strides {v.stride()} differ from k_{name}'s {k.stride()}; "
                              f"give both the same layout (e.g. .contiguous() on each)")


def window_attention(q: torch.Tensor, k_prev: torch.Tensor, v_prev: torch.Tensor, k_cur: torch.Tensor,
                     v_cur: torch.Tensor, valid_frames: torch.Tensor, prev_frames: int, units: int,
                     out: torch.Tensor | None = None, config: triton.Config | None = None) -> torch.Tensor:
    """Launch the Triton kernel (CUDA tensors, or CPU tensors under TRITON_INTERPRET=1); autotuned
    unless ``config`` (e.g. one of :func:`autotune_configs`) fixes the tiling."""
    check_window_attention(q, k_prev, v_prev, k_cur, v_cur, valid_frames)
    b, lq, h, d = q.shape
    out = torch.empty_like(q) if out is None else out
    grid = lambda meta: (triton.cdiv(lq, meta["BLOCK_M"]), b * h)  # noqa: E731
    fixed = {} if config is None else dict(config.kwargs, num_warps=config.num_warps, num_stages=config.num_stages)
    kernel = window_attention_kernel if config is None else _window_attention_kernel
    wrap_triton(kernel)[grid](
        q, k_prev, v_prev, k_cur, v_cur, valid_frames,
        q.stride(0), q.stride(1), q.stride(2),
        k_prev.stride(0), k_prev.stride(1), k_prev.stride(2),
        k_cur.stride(0), k_cur.stride(1), k_cur.stride(2),
        out.stride(0), out.stride(1), out.stride(2),
        lq, k_prev.shape[1], k_cur.shape[1], h, prev_frames, units, out,
        qk_scale=LOG2E / math.sqrt(d), HEAD_DIM=d, DOT_PRECISION=dot_precision(q.dtype), **fixed)
    return out


def window_attention_plan(q: TensorArg, k_prev: TensorArg, v_prev: TensorArg, k_cur: TensorArg, v_cur: TensorArg,
                          valid_frames: TensorArg, prev_frames: int, units: int, *, tactic: int = 0,
                          arch: int | None = None) -> Plan:
    """The TensorRT plan of contiguous [B, L, H, D] tensors with tiling ``GPU_TILINGS[tactic]``, for
    the current GPU or compute capability ``arch``."""
    b, lq, h, d = q.shape
    n_prev, n_cur = k_prev.shape[1], k_cur.shape[1]
    launch = tiling_launch(GPU_TILINGS[tactic])
    pointers = {"Q": q.dtype, "KP": k_prev.dtype, "VP": v_prev.dtype, "KC": k_cur.dtype, "VC": v_cur.dtype,
                "Valid": valid_frames.dtype}
    row = h * d
    scalars = {"stride_qb": lq * row, "stride_qm": row, "stride_qh": d, "stride_pb": n_prev * row,
               "stride_pn": row, "stride_ph": d, "stride_cb": n_cur * row, "stride_cn": row, "stride_ch": d,
               "stride_ob": lq * row, "stride_om": row, "stride_oh": d, "Lq": lq, "n_prev": n_prev, "n_cur": n_cur,
               "H": h, "prev_frames": prev_frames, "units": units}
    compiled = compile_ptx(_window_attention_kernel, pointers, scalars, {"Out": q.dtype},
                           {"qk_scale": LOG2E / math.sqrt(d), "HEAD_DIM": d, "DOT_PRECISION": dot_precision(q.dtype)},
                           launch, arch)
    return Plan(compiled, (triton.cdiv(lq, launch.blocks["BLOCK_M"]), b * h), list(scalars.values()))
