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

norm_rope is the same of one tensor x [B, L, C] whose L rows form T equal runs, one per row of
cos, sin [T, D/2]: the keyboard attention's queries, [frame, spatial token] rows rotated per frame
(their keys come from the keyboard window, normed and rotated apart).
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


def reference_norm_rope(x: torch.Tensor, w: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, eps: float,
                        group: int) -> torch.Tensor:
    """Pure PyTorch: :func:`reference_qk_norm_rope` of x alone, each row of cos, sin over a run of L / T rows."""
    run = x.shape[1] // cos.shape[0]
    cos, sin = (t.repeat_interleave(run, dim=0) for t in (cos, sin))
    return reference_qk_norm_rope(x, x, w, w, cos, sin, eps, group)[0]


@triton.jit
def _norm_rope_row(src, w, dst, COS, SIN, row, table_row, C, HALF_D, GROUP, stride_row, stride_out_row,
                   eps: tl.constexpr, BLOCK_PAIRS: tl.constexpr, GROUP_PAIRS: tl.constexpr):
    """Row ``row`` of src, normed (weight w) and rotated by row ``table_row`` of the tables, into dst.
    The row is read and written as one contiguous run of channels and split into its pairs in
    registers (loads and stores of 16 bytes a thread; a load of every other channel took twice the
    instructions and wrote each sector in halves)."""
    channels = tl.arange(0, 2 * BLOCK_PAIRS)
    mask = channels < C
    x = tl.load(src + row * stride_row + channels, mask=mask, other=0.0).to(tl.float32)
    wx = tl.load(w + channels, mask=mask, other=0.0).to(tl.float32)
    a, b = tl.split(tl.reshape(x, (BLOCK_PAIRS, 2)))
    wa, wb = tl.split(tl.reshape(wx, (BLOCK_PAIRS, 2)))
    # one statistic per group of GROUP_PAIRS pairs (groups tile the block; masked pairs add 0)
    groups = tl.reshape(a * a + b * b, (BLOCK_PAIRS // GROUP_PAIRS, GROUP_PAIRS))
    rrms = tl.math.rsqrt(tl.sum(groups, 1) / GROUP + eps)
    rrms = tl.reshape(tl.broadcast_to(rrms[:, None], (BLOCK_PAIRS // GROUP_PAIRS, GROUP_PAIRS)), (BLOCK_PAIRS,))
    a = a * rrms * wa
    b = b * rrms * wb
    pairs = tl.arange(0, BLOCK_PAIRS)
    table = table_row * HALF_D + pairs % HALF_D
    in_row = pairs < C // 2
    c = tl.load(COS + table, mask=in_row, other=1.0)
    s = tl.load(SIN + table, mask=in_row, other=0.0)
    y = tl.reshape(tl.join(a * c - b * s, a * s + b * c), (2 * BLOCK_PAIRS,))
    tl.store(dst + row * stride_out_row + channels, y.to(dst.dtype.element_ty), mask=mask)


@triton.jit
def _qk_norm_rope_kernel(Q, K, WQ, WK, COS, SIN,  # inputs, then int32 scalars, then the outputs
                         L, C, HALF_D, GROUP, stride_row, stride_out_row,
                         QO, KO,
                         eps: tl.constexpr, BLOCK_PAIRS: tl.constexpr, GROUP_PAIRS: tl.constexpr):
    row = tl.program_id(0)  # token index in [0, B*L)
    which = tl.program_id(1)  # 0: q, 1: k
    _norm_rope_row(tl.where(which == 0, Q, K), tl.where(which == 0, WQ, WK), tl.where(which == 0, QO, KO),
                   COS, SIN, row, row % L, C, HALF_D, GROUP, stride_row, stride_out_row, eps, BLOCK_PAIRS, GROUP_PAIRS)


@triton.jit
def _norm_rope_kernel(X, W, COS, SIN,  # inputs, then int32 scalars, then the output
                      L, C, HALF_D, GROUP, RUN, stride_row, stride_out_row,
                      OUT,
                      eps: tl.constexpr, BLOCK_PAIRS: tl.constexpr, GROUP_PAIRS: tl.constexpr):
    row = tl.program_id(0)  # row index in [0, B*L); a table row per RUN rows
    _norm_rope_row(X, W, OUT, COS, SIN, row, (row % L) // RUN, C, HALF_D, GROUP, stride_row, stride_out_row, eps,
                   BLOCK_PAIRS, GROUP_PAIRS)


def group_launch(c: int, half_d: int, group: int, op: str = "qk_norm_rope") -> Launch:
    """The row launch over C/2 pairs with GROUP_PAIRS, the pairs of one statistic (the whole block
    when one statistic covers the row). ``group`` must be C, or an even divisor of C whose pairs are
    a power of two; either way whole heads of 2 * ``half_d`` channels or an even split of one."""
    launch = row_launch("BLOCK_PAIRS", c // 2)
    pairs = launch.blocks["BLOCK_PAIRS"]
    if group != c and (group < 2 or group % 2 or c % group or next_power_of_two(group // 2) != group // 2):
        raise WanTrtError(f"{op}: group {group} must be C = {c}, or divide it with a power of two of pairs")
    if group % (2 * half_d) and (2 * half_d) % group:
        raise WanTrtError(f"{op}: group {group} must hold whole heads of {2 * half_d} or split one evenly")
    return Launch({"BLOCK_PAIRS": pairs, "GROUP_PAIRS": pairs if group == c else group // 2}, launch.num_warps,
                  launch.num_stages)


def _check(op: str, x: torch.Tensor, weights: tuple[torch.Tensor, ...], cos: torch.Tensor, sin: torch.Tensor,
           table_rows: int, group: int) -> Launch:
    """What both launchers need of x [B, L, C] (unit last stride, rows evenly strided), the weights and
    the fp32 tables [table_rows, D/2], as clear errors; returns the launch."""
    b, length, c = x.shape
    half = cos.shape[-1]
    launch = group_launch(c, half, group, op)
    if cos.shape != (table_rows, half) or sin.shape != cos.shape or cos.dtype != torch.float32 or c % (2 * half):
        raise WanTrtError(f"{op}: cos/sin must be fp32 [{table_rows}, D/2] with D dividing {c}; "
                          f"got {tuple(cos.shape)} {cos.dtype}")
    if any(w.shape != (c,) for w in weights):
        raise WanTrtError(f"{op}: weights must be [{c}]")
    if x.stride(-1) != 1 or x.stride(0) != length * x.stride(1):
        raise WanTrtError(f"{op}: rows must have unit last stride and be evenly strided across the batch")
    return launch


def qk_norm_rope(q: torch.Tensor, k: torch.Tensor, w_q: torch.Tensor, w_k: torch.Tensor, cos: torch.Tensor,
                 sin: torch.Tensor, eps: float, group: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Launch the kernel; q, k [B, L, C] rows with unit last stride, cos/sin fp32 [L, D/2]."""
    b, length, c = q.shape
    if k.shape != q.shape or k.dtype != q.dtype or k.stride() != q.stride():
        raise WanTrtError(f"qk_norm_rope: q {tuple(q.shape)} and k {tuple(k.shape)} must match in shape, dtype and "
                          "strides")
    launch = _check("qk_norm_rope", q, (w_q, w_k), cos, sin, length, group)
    q_out = torch.empty(q.shape, dtype=q.dtype, device=q.device)
    k_out = torch.empty_like(q_out)
    wrap_triton(_qk_norm_rope_kernel)[(b * length, 2)](
        q, k, w_q, w_k, cos.contiguous(), sin.contiguous(), length, c, cos.shape[-1], group, q.stride(1),
        q_out.stride(1), q_out, k_out, eps=eps, **launch.kwargs())
    return q_out, k_out


def norm_rope(x: torch.Tensor, w: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, eps: float, group: int
              ) -> torch.Tensor:
    """Launch the kernel; x [B, L, C] rows with unit last stride, cos/sin fp32 [T, D/2], T dividing L."""
    b, length, c = x.shape
    rows = cos.shape[0] if cos.ndim == 2 else 0
    if not rows or length % rows:
        raise WanTrtError(f"norm_rope: cos/sin must be [T, D/2] with T dividing the {length} rows of x; "
                          f"got {tuple(cos.shape)}")
    launch = _check("norm_rope", x, (w,), cos, sin, rows, group)
    out = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    wrap_triton(_norm_rope_kernel)[(b * length,)](
        x, w, cos.contiguous(), sin.contiguous(), length, c, cos.shape[-1], group, length // rows, x.stride(1),
        out.stride(1), out, eps=eps, **launch.kwargs())
    return out


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


def norm_rope_plan(x: TensorArg, w: TensorArg, cos: TensorArg, sin: TensorArg, eps: float, group: int, *,
                   tactic: int = 0, arch: int | None = None) -> Plan:
    """The TensorRT plan of a contiguous x [B, L, C], for the current GPU or compute capability ``arch``."""
    b, length, c = x.shape
    if length % cos.shape[0]:  # the kernel would read past the tables
        raise WanTrtError(f"norm_rope: cos/sin must be [T, D/2] with T dividing the {length} rows of x; "
                          f"got {tuple(cos.shape)}")
    scalars = {"L": length, "C": c, "HALF_D": cos.shape[1], "GROUP": group, "RUN": length // cos.shape[0],
               "stride_row": c, "stride_out_row": c}
    compiled = compile_ptx(_norm_rope_kernel, {"X": x.dtype, "W": w.dtype, "COS": cos.dtype, "SIN": sin.dtype},
                           scalars, {"OUT": x.dtype}, {"eps": eps}, group_launch(c, cos.shape[1], group, "norm_rope"),
                           arch)
    return Plan(compiled, (b * length,), list(scalars.values()))
