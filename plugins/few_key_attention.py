"""Few-key attention: the action module's attentions, where each query sees a handful of keys
(the mouse path: 3 queries per token over 6 keys; the keyboard path: every token over the same 6).

    out[m] = sum_n softmax_n(q[m] . k[n] / sqrt(D)) v[n],  n over
        prev keys [first_valid, P*U)  with first_valid = (P - valid_frames) * U
        cur keys  [0, n_cur)

the semantics of window attention (same inputs, same reference), computed differently. One
program takes a block of queries with all their heads ([BLOCK_M, H, D]) and walks the keys one
at a time: an online softmax of matrix-vector products in fp32, current keys first (always
valid, so the running maximum is finite from the start), then the previous keys, masked by
``valid_frames`` (read on the device). No tensor-core tiles: at 3-8 keys a 16-wide tile would be
mostly padding, and a dot of fp32 inputs would round to TF32 (Triton turns a broadcast
product-and-sum of two broadcast operands into such a dot; one key at a time it does not). The
previous and current keys are read where they are (no concatenation). bf16/fp16/fp32 in and out.

Shapes: q [B, Lq, H, D], k_cur/v_cur [B, n_cur, H, D], k_prev/v_prev [B, P*U, H, D] (any strides
but a unit last one), valid_frames int32 [1]. D a power of two; at most ``MAX_FEW_KEYS`` keys.
"""
from __future__ import annotations

import math

import torch
import triton
import triton.language as tl
from torch.library import wrap_triton

from wan_trt.errors import WanTrtError
from wan_trt.plugins.aot import Plan, TensorArg, compile_ptx
from wan_trt.plugins.launch import MAX_FEW_KEYS, few_key_launch
from wan_trt.plugins.window_attention import check_attention_inputs, reference_window_attention


def reference_few_key_attention(q: torch.Tensor, k_prev: torch.Tensor, v_prev: torch.Tensor, k_cur: torch.Tensor,
                                v_cur: torch.Tensor, valid_frames: torch.Tensor, prev_frames: int,
                                units: int) -> torch.Tensor:
    """Pure PyTorch (fp32 math): window attention's reference, the same semantics."""
    return reference_window_attention(q, k_prev, v_prev, k_cur, v_cur, valid_frames, prev_frames, units)


@triton.jit
def _few_key_step(acc, l_i, m_i, q, k, v, keep):
    """Online-softmax update of (acc [M, H, D], l, m [M, H]) with one key row k, v [H, D] (if ``keep``)."""
    s = tl.where(keep, tl.sum(q * k[None, :, :], axis=2), float("-inf"))
    m_new = tl.maximum(m_i, s)
    alpha = tl.exp(m_i - m_new)
    p = tl.exp(s - m_new)
    return acc * alpha[:, :, None] + p[:, :, None] * v[None, :, :], l_i * alpha + p, m_new


@triton.jit
def _few_key_attention_kernel(Q, KP, VP, KC, VC, Valid,  # inputs, then int32 scalars, then the output
                              stride_qb, stride_qm, stride_qh,
                              stride_kpb, stride_kpn, stride_kph, stride_vpb, stride_vpn, stride_vph,
                              stride_kcb, stride_kcn, stride_kch, stride_vcb, stride_vcn, stride_vch,
                              stride_ob, stride_om, stride_oh,
                              Lq, H, prev_frames, units,
                              Out,
                              scale: tl.constexpr, N_PREV: tl.constexpr, N_CUR: tl.constexpr,
                              HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_H: tl.constexpr):
    pid_m = tl.program_id(0)
    b = tl.program_id(1)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_h = tl.arange(0, BLOCK_H)
    offs_d = tl.arange(0, HEAD_DIM)
    heads = (offs_h < H)[:, None]  # [H, 1]
    rows = (offs_m[:, None, None] < Lq) & heads[None, :, :]  # [M, H, 1]
    q_at = offs_m[:, None, None] * stride_qm + offs_h[None, :, None] * stride_qh + offs_d[None, None, :]
    q = tl.load(Q + b * stride_qb + q_at, mask=rows, other=0.0).to(tl.float32) * scale
    kc = KC + b * stride_kcb + offs_h[:, None] * stride_kch + offs_d[None, :]
    vc = VC + b * stride_vcb + offs_h[:, None] * stride_vch + offs_d[None, :]
    # the first current key starts the softmax: m = its scores, l = 1, acc = its value
    k = tl.load(kc, mask=heads, other=0.0).to(tl.float32)
    v = tl.load(vc, mask=heads, other=0.0).to(tl.float32)
    m_i = tl.sum(q * k[None, :, :], axis=2)
    l_i = tl.full([BLOCK_M, BLOCK_H], 1.0, tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_H, HEAD_DIM], tl.float32) + v[None, :, :]
    for j in tl.static_range(1, N_CUR):
        k = tl.load(kc + j * stride_kcn, mask=heads, other=0.0).to(tl.float32)
        v = tl.load(vc + j * stride_vcn, mask=heads, other=0.0).to(tl.float32)
        acc, l_i, m_i = _few_key_step(acc, l_i, m_i, q, k, v, True)
    first_valid = (prev_frames - tl.load(Valid)) * units
    kp = KP + b * stride_kpb + offs_h[:, None] * stride_kph + offs_d[None, :]
    vp = VP + b * stride_vpb + offs_h[:, None] * stride_vph + offs_d[None, :]
    for j in tl.static_range(N_PREV):
        k = tl.load(kp + j * stride_kpn, mask=heads, other=0.0).to(tl.float32)
        v = tl.load(vp + j * stride_vpn, mask=heads, other=0.0).to(tl.float32)
        acc, l_i, m_i = _few_key_step(acc, l_i, m_i, q, k, v, j >= first_valid)
    out = acc / l_i[:, :, None]
    o_at = offs_m[:, None, None] * stride_om + offs_h[None, :, None] * stride_oh + offs_d[None, None, :]
    tl.store(Out + b * stride_ob + o_at, out.to(Out.dtype.element_ty), mask=rows)


def check_few_key_attention(q, k_prev, v_prev, k_cur, v_cur, valid_frames) -> None:
    """The launcher's limits, as clear errors."""
    check_attention_inputs("few_key_attention", q, k_prev, v_prev, k_cur, v_cur, valid_frames, min_head_dim=1)
    if k_cur.shape[1] < 1:
        raise WanTrtError("few_key_attention: no current keys (the block's own keys are always attended)")
    if k_prev.shape[1] + k_cur.shape[1] > MAX_FEW_KEYS:
        raise WanTrtError(f"few_key_attention: {k_prev.shape[1] + k_cur.shape[1]} keys, at most {MAX_FEW_KEYS}; "
                          "use window_attention for long key sequences")


def few_key_attention(q: torch.Tensor, k_prev: torch.Tensor, v_prev: torch.Tensor, k_cur: torch.Tensor,
                      v_cur: torch.Tensor, valid_frames: torch.Tensor, prev_frames: int,
                      units: int) -> torch.Tensor:
    """Launch the Triton kernel (CUDA tensors, or CPU tensors under TRITON_INTERPRET=1)."""
    check_few_key_attention(q, k_prev, v_prev, k_cur, v_cur, valid_frames)
    b, lq, h, d = q.shape
    n_prev, n_cur = k_prev.shape[1], k_cur.shape[1]
    out = torch.empty(q.shape, dtype=q.dtype, device=q.device)
    launch = few_key_launch(lq, h, d)
    wrap_triton(_few_key_attention_kernel)[(triton.cdiv(lq, launch.blocks["BLOCK_M"]), b)](
        q, k_prev, v_prev, k_cur, v_cur, valid_frames,
        *q.stride()[:3], *k_prev.stride()[:3], *v_prev.stride()[:3], *k_cur.stride()[:3], *v_cur.stride()[:3],
        *out.stride()[:3], lq, h, prev_frames, units, out,
        scale=1 / math.sqrt(d), N_PREV=n_prev, N_CUR=n_cur, HEAD_DIM=d, **launch.kwargs())
    return out


def few_key_attention_plan(q: TensorArg, k_prev: TensorArg, v_prev: TensorArg, k_cur: TensorArg, v_cur: TensorArg,
                           valid_frames: TensorArg, prev_frames: int, units: int, *, tactic: int = 0,
                           arch: int | None = None) -> Plan:
    """The TensorRT plan of contiguous [B, L, H, D] tensors, for the current GPU or compute capability ``arch``."""
    b, lq, h, d = q.shape
    n_prev, n_cur = k_prev.shape[1], k_cur.shape[1]
    launch = few_key_launch(lq, h, d)
    row = h * d
    pointers = {"Q": q.dtype, "KP": k_prev.dtype, "VP": v_prev.dtype, "KC": k_cur.dtype, "VC": v_cur.dtype,
                "Valid": valid_frames.dtype}
    scalars = {"stride_qb": lq * row, "stride_qm": row, "stride_qh": d}
    for name, n in (("kp", n_prev), ("vp", n_prev), ("kc", n_cur), ("vc", n_cur)):
        scalars.update({f"stride_{name}b": n * row, f"stride_{name}n": row, f"stride_{name}h": d})
    scalars.update({"stride_ob": lq * row, "stride_om": row, "stride_oh": d, "Lq": lq, "H": h,
                    "prev_frames": prev_frames, "units": units})
    compiled = compile_ptx(_few_key_attention_kernel, pointers, scalars, {"Out": q.dtype},
                           {"scale": 1 / math.sqrt(d), "N_PREV": n_prev, "N_CUR": n_cur, "HEAD_DIM": d}, launch, arch)
    return Plan(compiled, (triton.cdiv(lq, launch.blocks["BLOCK_M"]), b), list(scalars.values()))
