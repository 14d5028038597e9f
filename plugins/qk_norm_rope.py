"""qk-norm + RoPE: RMSNorm of q and k over groups of ``group`` channels (fp32 statistics, learned
weight), then the rotary embedding, in one pass over each token row.

    y = x / sqrt(mean(x^2) + eps) * w       mean over each group of ``group`` channels: all C = H * D
                                            (the main attention) or one head (the action attentions)
    (y[2i], y[2i+1]) -> (y[2i] cos - y[2i+1] sin, y[2i] sin + y[2i+1] cos)
        with cos, sin = tables[token, i mod D/2]               (same for every head)

q, k: [B, L, C] rows with unit last stride (the q/k Linear outputs, or views of one qkv output);
w_q, w_k: [C]; cos, sin: fp32 [L, D/2], the per-token factors (the main attention's 3D RoPE built
in the graph from the block's frame factors; the mouse attention's per frame, its rows being
[spatial token, frame]). Outputs are contiguous [B, L, C] of q's dtype: q for the attention, k in
the layout the cache stores.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch.library import wrap_triton

from wan_trt.errors import WanTrtError
from wan_trt.plugins.aot import Plan, TensorArg, compile_ptx
from wan_trt.plugins.launch import Launch, next_power_of_two, row_launch


def reference_qk_norm_rope(q: torch.Tensor, k: torch.Tensor, w_q: torch.Tensor, w_k: torch.Tensor,
                           cos: torch.Tensor, sin: torch.Tensor, eps: float, group: int
                           ) -> tuple[torch.Tensor, torch.Tensor]:
    """Pure PyTorch in fp32, rounded once to the input dtype."""
    def one(x, w):
        xf = x.float().unflatten(-1, (-1, group))
        y = (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)).flatten(-2) * w.float()
        y = y.unflatten(-1, (-1, cos.shape[-1], 2))  # [B, L, H, D/2, 2]
        a, b = y[..., 0], y[..., 1]
        c, s = cos[None, :, None, :], sin[None, :, None, :]
        return torch.stack([a * c - b * s, a * s + b * c], dim=-1).flatten(-3).to(x.dtype)
    return one(q, w_q), one(k, w_k)


@triton.jit
def _qk_norm_rope_kernel(Q, K, WQ, WK, COS, SIN,  # inputs, then int32 scalars, then the outputs
                         L, C, HALF_D, GROUP, stride_row, stride_out_row,
                         QO, KO,
                         eps: tl.constexpr, BLOCK_PAIRS: tl.constexpr, GROUP_PAIRS: tl.constexpr):
    row = tl.program_id(0)  # token index in [0, B*L)
    which = tl.program_id(1)  # 0: q, 1: k
    src = tl.where(which == 0, Q, K)
    dst = tl.where(which == 0, QO, KO)
    w = tl.where(which == 0, WQ, WK)
    pairs = tl.arange(0, BLOCK_PAIRS)
    mask = pairs < C // 2
    base = src + row * stride_row
    a = tl.load(base + 2 * pairs, mask=mask, other=0.0).to(tl.float32)
    b = tl.load(base + 2 * pairs + 1, mask=mask, other=0.0).to(tl.float32)
    # one statistic per group of GROUP_PAIRS pairs (groups tile the block; masked pairs add 0)
    groups = tl.reshape(a * a + b * b, (BLOCK_PAIRS // GROUP_PAIRS, GROUP_PAIRS))
    rrms = tl.math.rsqrt(tl.sum(groups, 1) / GROUP + eps)
    rrms = tl.reshape(tl.broadcast_to(rrms[:, None], (BLOCK_PAIRS // GROUP_PAIRS, GROUP_PAIRS)), (BLOCK_PAIRS,))
    a = a * rrms * tl.load(w + 2 * pairs, mask=mask, other=0.0).to(tl.float32)
    b = b * rrms * tl.load(w + 2 * pairs + 1, mask=mask, other=0.0).to(tl.float32)
    token = row % L
    table = token * HALF_D + pairs % HALF_D
    c = tl.load(COS + table, mask=mask, other=1.0)
    s = tl.load(SIN + table, mask=mask, other=0.0)
    out = dst + row * stride_out_row
    tl.store(out + 2 * pairs, (a * c - b * s).to(dst.dtype.element_ty), mask=mask)
    tl.store(out + 2 * pairs + 1, (a * s + b * c).to(dst.dtype.element_ty), mask=mask)


def group_launch(c: int, half_d: int, group: int) -> Launch:
    """The row launch over C/2 pairs with GROUP_PAIRS, the pairs of one statistic (the whole block
    when one statistic covers the row). ``group`` must be C, or an even divisor of C whose pairs are
    a power of two; either way whole heads of 2 * ``half_d`` channels or an even split of one."""
    launch = row_launch("BLOCK_PAIRS", c // 2)
    pairs = launch.blocks["BLOCK_PAIRS"]
    if group != c and (group < 2 or group % 2 or c % group or next_power_of_two(group // 2) != group // 2):
        raise WanTrtError(f"qk_norm_rope: group {group} must be C = {c}, or divide it with a power of two of pairs")
    if group % (2 * half_d) and (2 * half_d) % group:
        raise WanTrtError(f"qk_norm_rope: group {group} must hold whole heads of {2 * half_d} or split one evenly")
    return Launch({"BLOCK_PAIRS": pairs, "GROUP_PAIRS": pairs if group == c else group // 2}, launch.num_warps,
                  launch.num_stages)


def qk_norm_rope(q: torch.Tensor, k: torch.Tensor, w_q: torch.Tensor, w_k: torch.Tensor, cos: torch.Tensor,
                 sin: torch.Tensor, eps: float, group: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Launch the kernel; q, k [B, L, C] rows with unit last stride, cos/sin fp32 [L, D/2]."""
    b, length, c = q.shape
    half = cos.shape[-1]
    launch = group_launch(c, half, group)
    if k.shape != q.shape or k.dtype != q.dtype or q.stride(-1) != 1 or k.stride() != q.stride():
        raise WanTrtError(f"qk_norm_rope: q {tuple(q.shape)} and k {tuple(k.shape)} must match with unit last stride")
    if cos.shape != (length, half) or sin.shape != cos.shape or cos.dtype != torch.float32 or c % (2 * half):
        raise WanTrtError(f"qk_norm_rope: cos/sin must be fp32 [{length}, D/2] with D dividing {c}; "
                          f"got {tuple(cos.shape)} {cos.dtype}")
    if w_q.shape != (c,) or w_k.shape != (c,):
        raise WanTrtError(f"qk_norm_rope: weights must be [{c}]")
    if q.stride(0) != length * q.stride(1):
        raise WanTrtError("qk_norm_rope: q/k rows must be evenly strided across the batch")
    q_out = torch.empty(q.shape, dtype=q.dtype, device=q.device)
    k_out = torch.empty_like(q_out)
    wrap_triton(_qk_norm_rope_kernel)[(b * length, 2)](
        q, k, w_q, w_k, cos.contiguous(), sin.contiguous(), length, c, half, group, q.stride(1), q_out.stride(1),
        q_out, k_out, eps=eps, **launch.kwargs())
    return q_out, k_out


def qk_norm_rope_plan(q: TensorArg, k: TensorArg, w_q: TensorArg, w_k: TensorArg, cos: TensorArg, sin: TensorArg,
                      eps: float, group: int, *, tactic: int = 0, arch: int | None = None) -> Plan:
    """The TensorRT plan of contiguous q, k [B, L, C], for the current GPU or compute capability ``arch``."""
    b, length, c = q.shape
    scalars = {"L": length, "C": c, "HALF_D": cos.shape[1], "GROUP": group, "stride_row": c, "stride_out_row": c}
    compiled = compile_ptx(_qk_norm_rope_kernel,
                           {"Q": q.dtype, "K": k.dtype, "WQ": w_q.dtype, "WK": w_k.dtype, "COS": cos.dtype,
                            "SIN": sin.dtype}, scalars, {"QO": q.dtype, "KO": k.dtype}, {"eps": eps},
                           group_launch(c, cos.shape[1], group), arch)
    return Plan(compiled, (b * length, 2), list(scalars.values()))
