"""Few-key attention: the action module's attentions, where each query sees a handful of keys
(the mouse path: 3 queries per token over 6 keys; the keyboard path: every token over the same 6).

    out[m] = sum_n softmax_n(q[m] . k[n] / sqrt(D)) v[n],  n over
        prev keys [first_valid, P*U)  with first_valid = (P - valid_frames) * U
        cur keys  [0, n_cur)

the semantics of window attention (same inputs, same reference), computed differently: all the
keys of a (batch, head) fit in registers, so one program loads its queries once, the keys and
values once, and forms the scores, softmax and weighted sum in fp32 with plain multiply-adds
(no tensor-core tiles: at 3-8 keys a tile of 16 would be mostly padding). bf16/fp16/fp32 in and
out, fp32 math, the previous and current keys read where they are (no concatenation), and
``valid_frames`` read on the device.

Shapes: q [B, Lq, H, D], k_cur/v_cur [B, n_cur, H, D], k_prev/v_prev [B, P*U, H, D] (any row
strides, unit last stride), valid_frames int32 [1]. D a power of two; at most
``MAX_KEYS`` keys in all.
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
from wan_trt.plugins.window_attention import reference_window_attention


def reference_few_key_attention(q: torch.Tensor, k_prev: torch.Tensor, v_prev: torch.Tensor, k_cur: torch.Tensor,
                                v_cur: torch.Tensor, valid_frames: torch.Tensor, prev_frames: int,
                                units: int) -> torch.Tensor:
    """Pure PyTorch (fp32 math): window attention's reference, the same semantics."""
    return reference_window_attention(q, k_prev, v_prev, k_cur, v_cur, valid_frames, prev_frames, units)


@triton.jit
def _few_key_attention_kernel(Q, KP, VP, KC, VC, Valid,  # inputs, then int32 scalars, then the output
                              stride_qb, stride_qm, stride_qh,
                              stride_kpb, stride_kpn, stride_kph, stride_vpb, stride_vpn, stride_vph,
                              stride_kcb, stride_kcn, stride_kch, stride_vcb, stride_vcn, stride_vch,
                              stride_ob, stride_om, stride_oh,
                              Lq, n_prev, n_cur, H, prev_frames, units,
                              Out,
                              scale: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr,
                              BLOCK_K: tl.constexpr):
    pid_m = tl.program_id(0)
    pid_bh = tl.program_id(1)
    b = pid_bh // H
    h = pid_bh % H
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, HEAD_DIM)
    offs_k = tl.arange(0, BLOCK_K)  # key slot: previous keys first, then the current ones
    rows = offs_m[:, None] < Lq
    q = tl.load(Q + b * stride_qb + h * stride_qh + offs_m[:, None] * stride_qm + offs_d[None, :],
                mask=rows, other=0.0).to(tl.float32)
    in_prev = offs_k < n_prev
    in_cur = (offs_k >= n_prev) & (offs_k < n_prev + n_cur)
    cur = tl.where(in_cur, offs_k - n_prev, 0)
    prev = tl.where(in_prev, offs_k, 0)
    k = (tl.load(KP + b * stride_kpb + h * stride_kph + prev[:, None] * stride_kpn + offs_d[None, :],
                 mask=in_prev[:, None], other=0.0).to(tl.float32)
         + tl.load(KC + b * stride_kcb + h * stride_kch + cur[:, None] * stride_kcn + offs_d[None, :],
                   mask=in_cur[:, None], other=0.0).to(tl.float32))
    v = (tl.load(VP + b * stride_vpb + h * stride_vph + prev[:, None] * stride_vpn + offs_d[None, :],
                 mask=in_prev[:, None], other=0.0).to(tl.float32)
         + tl.load(VC + b * stride_vcb + h * stride_vch + cur[:, None] * stride_vcn + offs_d[None, :],
                   mask=in_cur[:, None], other=0.0).to(tl.float32))
    first_valid = tl.minimum(tl.maximum((prev_frames - tl.load(Valid)) * units, 0), n_prev)
    keep = ((offs_k >= first_valid) & in_prev) | in_cur
    scores = tl.sum(q[:, None, :] * k[None, :, :], axis=2) * scale  # [BLOCK_M, BLOCK_K]
    scores = tl.where(keep[None, :], scores, float("-inf"))
    p = tl.exp(scores - tl.max(scores, axis=1)[:, None])
    out = tl.sum(p[:, :, None] * v[None, :, :], axis=1) / tl.sum(p, axis=1)[:, None]
    tl.store(Out + b * stride_ob + h * stride_oh + offs_m[:, None] * stride_om + offs_d[None, :],
             out.to(Out.dtype.element_ty), mask=rows)


def check_few_key_attention(q, k_prev, v_prev, k_cur, v_cur, valid_frames) -> None:
    """The launcher's limits, as clear errors."""
    if q.dtype not in (torch.bfloat16, torch.float16, torch.float32):
        raise WanTrtError(f"few_key_attention: dtype {q.dtype} not supported (bf16, fp16, fp32)")
    d = q.shape[-1]
    if d & (d - 1) or not 1 <= d <= 256:
        raise WanTrtError(f"few_key_attention: head_dim {d} must be a power of two up to 256")
    for name, t in (("k_prev", k_prev), ("v_prev", v_prev), ("k_cur", k_cur), ("v_cur", v_cur)):
        if t.dtype != q.dtype or t.shape[0] != q.shape[0] or t.shape[2:] != q.shape[2:] or t.stride(-1) != 1:
            raise WanTrtError(f"few_key_attention: {name} {tuple(t.shape)} {t.dtype} does not match q "
                              f"{tuple(q.shape)} {q.dtype} (or its last dim is strided)")
    if k_cur.shape[1] != v_cur.shape[1] or k_prev.shape[1] != v_prev.shape[1] or q.stride(-1) != 1:
        raise WanTrtError("few_key_attention: k/v lengths differ or q's last dim is strided")
    if k_prev.shape[1] + k_cur.shape[1] > MAX_FEW_KEYS:
        raise WanTrtError(f"few_key_attention: {k_prev.shape[1] + k_cur.shape[1]} keys, at most {MAX_FEW_KEYS}; "
                          "use window_attention for long key sequences")
    if valid_frames.numel() != 1 or valid_frames.dtype != torch.int32:
        raise WanTrtError("few_key_attention: valid_frames must be an int32 tensor of one element")


def few_key_attention(q: torch.Tensor, k_prev: torch.Tensor, v_prev: torch.Tensor, k_cur: torch.Tensor,
                      v_cur: torch.Tensor, valid_frames: torch.Tensor, prev_frames: int,
                      units: int) -> torch.Tensor:
    """Launch the Triton kernel (CUDA tensors, or CPU tensors under TRITON_INTERPRET=1)."""
    check_few_key_attention(q, k_prev, v_prev, k_cur, v_cur, valid_frames)
    b, lq, h, d = q.shape
    n_prev, n_cur = k_prev.shape[1], k_cur.shape[1]
    out = torch.empty(q.shape, dtype=q.dtype, device=q.device)
    launch = few_key_launch(lq, n_prev + n_cur, d)
    wrap_triton(_few_key_attention_kernel)[(triton.cdiv(lq, launch.blocks["BLOCK_M"]), b * h)](
        q, k_prev, v_prev, k_cur, v_cur, valid_frames,
        *q.stride()[:3], *k_prev.stride()[:3], *v_prev.stride()[:3], *k_cur.stride()[:3], *v_cur.stride()[:3],
        *out.stride()[:3], lq, n_prev, n_cur, h, prev_frames, units, out,
        scale=1 / math.sqrt(d), HEAD_DIM=d, **launch.kwargs())
    return out


def few_key_attention_plan(q: TensorArg, k_prev: TensorArg, v_prev: TensorArg, k_cur: TensorArg, v_cur: TensorArg,
                           valid_frames: TensorArg, prev_frames: int, units: int, *, tactic: int = 0,
                           arch: int | None = None) -> Plan:
    """The TensorRT plan of contiguous [B, L, H, D] tensors, for the current GPU or compute capability ``arch``."""
    b, lq, h, d = q.shape
    n_prev, n_cur = k_prev.shape[1], k_cur.shape[1]
    launch = few_key_launch(lq, n_prev + n_cur, d)
    row = h * d
    pointers = {"Q": q.dtype, "KP": k_prev.dtype, "VP": v_prev.dtype, "KC": k_cur.dtype, "VC": v_cur.dtype,
                "Valid": valid_frames.dtype}
    scalars = {"stride_qb": lq * row, "stride_qm": row, "stride_qh": d}
    for name, n in (("kp", n_prev), ("vp", n_prev), ("kc", n_cur), ("vc", n_cur)):
        scalars.update({f"stride_{name}b": n * row, f"stride_{name}n": row, f"stride_{name}h": d})
    scalars.update({"stride_ob": lq * row, "stride_om": row, "stride_oh": d, "Lq": lq, "n_prev": n_prev,
                    "n_cur": n_cur, "H": h, "prev_frames": prev_frames, "units": units})
    compiled = compile_ptx(_few_key_attention_kernel, pointers, scalars, {"Out": q.dtype},
                           {"scale": 1 / math.sqrt(d), "HEAD_DIM": d}, launch, arch)
    return Plan(compiled, (triton.cdiv(lq, launch.blocks["BLOCK_M"]), b * h), list(scalars.values()))
