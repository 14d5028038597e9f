"""Small building blocks with upstream parameter names: norms, image projection, time embedding, attention."""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


class WanRMSNorm(nn.Module):
    """RMSNorm over the last dim: statistics in fp32, cast back, times the learned weight.

    ``y = (x / sqrt(mean(x^2) + eps)).to(x.dtype) * weight``
    """

    def __init__(self, dim: int, eps: float = 1e-5):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return rms_normalize(x, self.eps) * self.weight


class ActionRMSNorm(nn.Module):
    """The action module's RMSNorm: upstream keeps a ``weight`` parameter but never uses it.

    The parameter stays so upstream checkpoints load strictly; statistics are fp32 here
    (upstream computes them in the activation dtype).
    """

    def __init__(self, dim: int, eps: float = 1e-6):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return rms_normalize(x, self.eps)


def rms_normalize(x: torch.Tensor, eps: float) -> torch.Tensor:
    """Weightless RMS normalisation of the last dim in fp32, returned in x's dtype."""
    xf = x.float()
    return (xf * torch.rsqrt(xf.pow(2).mean(dim=-1, keepdim=True) + eps)).to(x.dtype)


class WanLayerNorm(nn.LayerNorm):
    """LayerNorm computed in fp32 and cast back to the input dtype (non-affine by default)."""

    def __init__(self, dim: int, eps: float = 1e-6, elementwise_affine: bool = False):
        super().__init__(dim, elementwise_affine=elementwise_affine, eps=eps)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        weight = None if self.weight is None else self.weight.float()
        bias = None if self.bias is None else self.bias.float()
        return F.layer_norm(x.float(), self.normalized_shape, weight, bias, self.eps).to(x.dtype)


class MLPProj(nn.Module):
    """CLIP features -> cross-attention context: LN -> Linear -> GELU -> Linear -> LN."""

    def __init__(self, in_dim: int, out_dim: int):
        super().__init__()
        self.proj = nn.Sequential(
            WanLayerNorm(in_dim, eps=1e-5, elementwise_affine=True), nn.Linear(in_dim, in_dim),
            nn.GELU(), nn.Linear(in_dim, out_dim), WanLayerNorm(out_dim, eps=1e-5, elementwise_affine=True))

    def forward(self, image_embeds: torch.Tensor) -> torch.Tensor:
        return self.proj(image_embeds)


def sinusoidal_embedding_1d(dim: int, position: torch.Tensor, dtype: torch.dtype = torch.float64) -> torch.Tensor:
    """[N] timesteps -> [N, dim] ``cat(cos(p w), sin(p w))``, ``w_i = 10000^(-i/(dim/2))``.

    float64 as upstream; graphs pass float32 (TensorRT has no float64 math).
    """
    half = dim // 2
    position = position.to(dtype)
    freqs = torch.pow(10000.0, -torch.arange(half, dtype=dtype, device=position.device).div(half))
    sinusoid = torch.outer(position, freqs)
    return torch.cat([torch.cos(sinusoid), torch.sin(sinusoid)], dim=1)


def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
              key_valid: torch.Tensor | None = None) -> torch.Tensor:
    """Softmax attention, scale 1/sqrt(D), no causal mask.

    q: [B, Lq, H, D]; k, v: [B, Lk, H, D]; key_valid: [Lk] bool or None. Returns [B, Lq, H, D].
    """
    # the mask is spelled out as [1, 1, Lq, Lk] (ONNX Attention-23 wants the query length)
    mask = None if key_valid is None else key_valid[None, None, None, :].expand(1, 1, q.shape[1], k.shape[1])
    out = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                                         attn_mask=mask)
    return out.transpose(1, 2)


def few_key_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                      key_valid: torch.Tensor | None = None) -> torch.Tensor:
    """The action attentions (a handful of keys per query): explicit fp32 softmax(q k^T / sqrt(D)) v.

    Same shapes as :func:`attention`. A fused-attention kernel's tiles would be almost all
    padding for 3 queries x 6 keys (5.6 ms of a 77 ms pass on an H200 through SDPA).
    """
    scores = torch.einsum("bqhd,bkhd->bhqk", q.float(), k.float()) * q.shape[-1] ** -0.5
    if key_valid is not None:
        scores = scores.masked_fill(~key_valid, float("-inf"))
    return torch.einsum("bhqk,bkhd->bqhd", scores.softmax(dim=-1), v.float()).to(q.dtype)
