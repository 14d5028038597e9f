"""The host side of RoPE: rotary frequencies and each block's position-dependent factors.

A rotary score depends only on the difference of two positions, and keys in the cache were
rotated at their own absolute positions, so the only thing a block needs from its absolute
start frame is ``cos``/``sin`` of ``frame * inv_freq`` for its own frames. The graph takes those
factors as inputs (a few hundred fp32 numbers per block) instead of an index into a fixed
table, so a stream has no table end (only the far bound below), and no angle is ever formed in fp32.

Angles are formed here in float64, as upstream's float64 tables form them (the same product,
so the same angles wherever upstream's table reaches). The product ``frame * inv_freq`` is
rounded once, to a relative 2**-53: below :data:`MAX_STREAM_FRAMES` at most 2**-25 rad, which
moves a factor by at most half the fp32 spacing of values in [0.5, 1), the size of fp32's own
rounding of the factor. ``cos``/``sin`` in float64 reduce any argument exactly, so no explicit
reduction modulo 2*pi is needed (it would add a rounding of its own). Nothing grows with the
position below that bound.
"""
from __future__ import annotations

import math

import torch

from wan_trt.config import WanConfig

# Latent frames a stream can reach (2**28 = 268M latent frames, over a billion video frames, about
# 16 months at 25 fps): below it the float64 angle's rounding moves a factor by at most half an
# fp32 step (see above). The session refuses a start past it and the step that would cross it;
# `wan-trt stream` refuses a --blocks past it up front (counters are int64; the bound is about angles).
MAX_STREAM_FRAMES = 1 << 28

MAIN_THETA = 10000.0


def rope_split(head_dim: int) -> tuple[int, int, int]:
    """Complex pairs given to (frame, height, width): (22, 21, 21) for head_dim 128."""
    c = head_dim // 2
    return c - 2 * (c // 3), c // 3, c // 3


def inverse_frequencies(pairs: int, dim: int, theta: float) -> tuple[float, ...]:
    """``theta ** (-2j / dim)`` for j < ``pairs``, in float64 (upstream ``rope_params`` with dim = 2*pairs)."""
    return tuple((1.0 / torch.pow(theta, torch.arange(0, 2 * pairs, 2, dtype=torch.float64, device="cpu") / dim)).tolist())


def main_frame_frequencies(head_dim: int) -> tuple[float, ...]:
    """Frequencies of the frame part of the 3D RoPE (22 for head_dim 128)."""
    pairs = rope_split(head_dim)[0]
    return inverse_frequencies(pairs, 2 * pairs, MAIN_THETA)


def action_frame_frequencies(temporal_dim: int, theta: float) -> tuple[float, ...]:
    """Frequencies of the action attentions' temporal RoPE (the first ``temporal_dim`` channels).

    Upstream forms these in fp32; for Matrix-Game's theta 256 and 8 channels they are powers of
    two (1, 1/4, 1/16, 1/64), equal in fp32 and float64. For another theta the float64 ones differ
    from upstream's by up to one fp32 step of the frequency (about 1e-5 rad at frame 7500).
    """
    return inverse_frequencies(temporal_dim // 2, temporal_dim, theta)


def block_frequencies(cfg: WanConfig) -> dict[str, tuple[float, ...]]:
    """The position-dependent rotaries of a config: ``frame`` (main attention) and, with an action
    module, ``action``; each maps to its frequencies."""
    out = {"frame": main_frame_frequencies(cfg.head_dim)}
    if cfg.action_layers:
        a = cfg.model.action_config
        out["action"] = action_frame_frequencies(a.mouse_qk_dim_list[0], float(a.rope_theta))
    return out


def rotary_factors(inv_freq: tuple[float, ...], start_frame: int, frames: int,
                   device: str | torch.device = "cpu") -> tuple[torch.Tensor, torch.Tensor]:
    """fp32 cos, sin [frames, len(inv_freq)] of ``(start_frame + f) * inv_freq``, formed in float64.

    Python's ``math`` (the C library's cos/sin, as the C++ runtime calls them) so that both
    runtimes feed the same bits.
    """
    angles = [[float(start_frame + f) * w for w in inv_freq] for f in range(frames)]
    cos = torch.tensor([[math.cos(a) for a in row] for row in angles], dtype=torch.float64, device="cpu")
    sin = torch.tensor([[math.sin(a) for a in row] for row in angles], dtype=torch.float64, device="cpu")
    return cos.float().to(device), sin.float().to(device)
