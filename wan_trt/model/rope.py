"""RoPE in the graph: the constant height/width part, the block's frame factors, and their application.

Main attention (3D RoPE): head_dim d = 2c values form c complex pairs
(x[2i], x[2i+1]), split into (frame, height, width) parts of sizes
``c - 2*(c//3), c//3, c//3`` (22/21/21 for d=128). Part p uses
``angle = pos * theta**(-2j/d_p)`` with d_p = 2*size_p and theta 10000. Height and width
positions are the fixed patch grid: their cos/sin are constants of the graph. The frame
position is absolute; its cos/sin arrive per block as inputs (:class:`BlockRope`, formed on the
host in float64 by :mod:`wan_trt.rotary`), so no position is limited by a table.

Action attention (1D temporal RoPE, upstream ``get_nd_rotary_pos_embed`` over a [frames, 1, 1]
grid): the first ``mouse_qk_dim_list[0]`` dims rotate with the frame position (theta =
rope_theta), the rest see position 0, i.e. cos = 1, sin = 0.

Rotation of an interleaved pair: ``(a, b) -> (a cos - b sin, a sin + b cos)``.
"""
from __future__ import annotations

from typing import NamedTuple

import torch
from torch import nn

from wan_trt.config import WanConfig
from wan_trt.rotary import MAIN_THETA, block_frequencies, inverse_frequencies, rope_split, rotary_factors


class BlockRope(NamedTuple):
    """The block's position-dependent rotary factors, fp32: what the graph takes instead of a frame index.

    frame_cos/frame_sin: [F, c_f] of the main attention's frame part; action_cos/action_sin:
    [F, temporal pairs] of the action attentions (None without an action module).
    """

    frame_cos: torch.Tensor
    frame_sin: torch.Tensor
    action_cos: torch.Tensor | None = None
    action_sin: torch.Tensor | None = None

    @classmethod
    def of(cls, factors: dict[str, tuple[torch.Tensor, torch.Tensor]]) -> "BlockRope":
        """From (cos, sin) by rotary kind (``frame``, ``action``: :func:`wan_trt.rotary.block_frequencies`)."""
        return cls(**{f"{kind}_{part}": t for kind, pair in factors.items() for part, t in zip(("cos", "sin"), pair)})

    @classmethod
    def at(cls, cfg: WanConfig, start_frame: int, device: str | torch.device = "cpu") -> "BlockRope":
        """The factors of the block starting at absolute latent frame ``start_frame``."""
        return cls.of({kind: rotary_factors(freqs, start_frame, cfg.block_frames, device)
                       for kind, freqs in block_frequencies(cfg).items()})


class RopeTables(nn.Module):
    """The constant part of RoPE as fp32 non-persistent buffers that stay fp32 under ``.to(dtype)``.

    Buffers: hw_cos/hw_sin [H*W, c_h + c_w] for the fixed patch grid. :meth:`main` and
    :meth:`action` join them with a block's :class:`BlockRope`.
    """

    def __init__(self, cfg: WanConfig):
        super().__init__()
        _, ch, cw = rope_split(cfg.head_dim)
        h, w = cfg.grid_hw
        height = _angles(h, inverse_frequencies(ch, 2 * ch, MAIN_THETA))
        width = _angles(w, inverse_frequencies(cw, 2 * cw, MAIN_THETA))
        hw = torch.cat([height[:, None, :].expand(h, w, -1), width[None, :, :].expand(h, w, -1)], dim=-1)
        hw = hw.reshape(h * w, -1)
        self.register_buffer("hw_cos", hw.cos().float(), persistent=False)
        self.register_buffer("hw_sin", hw.sin().float(), persistent=False)
        a = cfg.model.action_config
        self.action_still = a.head_dim // 2 - a.mouse_qk_dim_list[0] // 2  # pairs at position 0

    def _apply(self, fn, recurse=True):
        super()._apply(fn, recurse)
        for key, buf in self._buffers.items():
            if buf is not None and buf.dtype != torch.float32:
                self._buffers[key] = buf.float()
        return self

    def main(self, frame_cos: torch.Tensor, frame_sin: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """cos, sin [F * H * W, c] of the main attention from the block's frame factors [F, c_f]."""
        frames, hw = frame_cos.shape[0], self.hw_cos.shape[0]

        def table(frame_t: torch.Tensor, hw_t: torch.Tensor) -> torch.Tensor:
            return torch.cat([frame_t[:, None, :].expand(frames, hw, -1),
                              hw_t[None, :, :].expand(frames, hw, -1)], dim=-1).reshape(frames * hw, -1)

        return table(frame_cos.float(), self.hw_cos), table(frame_sin.float(), self.hw_sin)

    def action(self, cos: torch.Tensor, sin: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """cos, sin [F, ca] of the action attentions from the block's temporal factors [F, pairs]."""
        still = (cos.shape[0], self.action_still)
        return (torch.cat([cos.float(), cos.new_ones(still, dtype=torch.float32)], dim=1),
                torch.cat([sin.float(), sin.new_zeros(still, dtype=torch.float32)], dim=1))


def _angles(positions: int, inv_freq: tuple[float, ...]) -> torch.Tensor:
    """[positions, pairs] float64 angles of positions 0.. (the height/width grid)."""
    return torch.outer(torch.arange(positions, dtype=torch.float64), torch.tensor(inv_freq, dtype=torch.float64))


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate interleaved pairs of x in fp32; returns x's dtype.

    x: [..., 2c]; cos, sin: fp32, broadcastable to x's pairs [..., c]
    (e.g. [S, 1, c] against x [B, S, H, 2c]).
    """
    xf = x.float().unflatten(-1, (-1, 2))  # [..., c, 2]
    a, b = xf[..., 0], xf[..., 1]
    out = torch.stack([a * cos - b * sin, a * sin + b * cos], dim=-1)
    return out.flatten(-2).to(x.dtype)
