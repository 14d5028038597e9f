"""Rotary position tables (fp32 cos/sin) and their application.

Main attention (3D RoPE): head_dim d = 2c values form c complex pairs
(x[2i], x[2i+1]), split into (frame, height, width) parts of sizes
``c - 2*(c//3), c//3, c//3`` (22/21/21 for d=128). Part p uses
``angle = pos * theta**(-2j/d_p)`` with d_p = 2*size_p, theta 10000 and 1024
positions. The frame position is absolute (the block's start frame + f);
height and width start at 0. Upstream computes this in complex128; the angles
are computed in float64 here and stored as fp32 cos/sin, the form every graph
uses (no complex tensors in any graph).

Action attention (1D temporal RoPE, upstream ``get_nd_rotary_pos_embed`` with a
[7500, 1, 1] grid): the first ``mouse_qk_dim_list[0]`` dims rotate with the
frame position (theta = rope_theta, computed in fp32 as upstream), the rest see
position 0, i.e. cos = 1, sin = 0.

Rotation of an interleaved pair: ``(a, b) -> (a cos - b sin, a sin + b cos)``.
"""
from __future__ import annotations

import torch
from torch import nn

from wan_trt.config import WanConfig

ACTION_ROPE_FRAMES = 7500


def rope_split(head_dim: int) -> tuple[int, int, int]:
    """Complex pairs given to (frame, height, width): (22, 21, 21) for head_dim 128."""
    c = head_dim // 2
    return c - 2 * (c // 3), c // 3, c // 3


def _angles(positions: int, pairs: int, theta: float) -> torch.Tensor:
    # [positions, pairs] in float64, upstream rope_params: pos / theta**(2j / (2*pairs))
    inv = 1.0 / torch.pow(theta, torch.arange(0, 2 * pairs, 2, dtype=torch.float64) / (2 * pairs))
    return torch.outer(torch.arange(positions, dtype=torch.float64), inv)


def main_rope_angles(head_dim: int, max_frames: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Angle tables (frame [max_frames, c_f], height [max_frames, c_h], width [max_frames, c_w]), float64."""
    cf, ch, cw = rope_split(head_dim)
    return _angles(max_frames, cf, 10000.0), _angles(max_frames, ch, 10000.0), _angles(max_frames, cw, 10000.0)


def action_rope_angles(head_dim: int, dims: tuple[int, ...], theta: float) -> torch.Tensor:
    """[ACTION_ROPE_FRAMES, head_dim // 2] fp32 angles: temporal pairs first, zeros after."""
    pairs_t = dims[0] // 2
    inv = 1.0 / (theta ** (torch.arange(0, dims[0], 2, dtype=torch.float32)[:pairs_t] / dims[0]))
    temporal = torch.outer(torch.arange(ACTION_ROPE_FRAMES, dtype=torch.float32), inv)
    rest = torch.zeros(ACTION_ROPE_FRAMES, head_dim // 2 - pairs_t)
    return torch.cat([temporal, rest], dim=1)


class RopeTables(nn.Module):
    """fp32 cos/sin tables as non-persistent buffers that stay fp32 under ``.to(dtype)``.

    Buffers (c = head_dim // 2 pairs, ca = action head_dim // 2):
        frame_cos/frame_sin: [max_frames, c_f]; hw_cos/hw_sin: [H*W, c_h + c_w] for the
        fixed patch grid; action_cos/action_sin: [7500, ca].
    """

    def __init__(self, cfg: WanConfig):
        super().__init__()
        frame, height, width = main_rope_angles(cfg.head_dim, cfg.inference.rope_max_frames)
        h, w = cfg.grid_hw
        hw = torch.cat([height[:h, None, :].expand(h, w, -1), width[None, :w, :].expand(h, w, -1)], dim=-1)
        hw = hw.reshape(h * w, -1)
        a = cfg.model.action_config
        action = action_rope_angles(a.head_dim, a.mouse_qk_dim_list, float(a.rope_theta))
        for name, angles in (("frame", frame), ("hw", hw), ("action", action)):
            self.register_buffer(f"{name}_cos", angles.cos().float(), persistent=False)
            self.register_buffer(f"{name}_sin", angles.sin().float(), persistent=False)

    def _apply(self, fn, recurse=True):
        super()._apply(fn, recurse)
        for key, buf in self._buffers.items():
            if buf is not None and buf.dtype != torch.float32:
                self._buffers[key] = buf.float()
        return self

    def main(self, start_frame: torch.Tensor | int, frames: int) -> tuple[torch.Tensor, torch.Tensor]:
        """cos, sin [frames * H * W, c] for a block starting at absolute latent frame ``start_frame``."""
        rows = _frame_rows(start_frame, frames, self.frame_cos.device)
        hw = self.hw_cos.shape[0]

        def table(frame_t: torch.Tensor, hw_t: torch.Tensor) -> torch.Tensor:
            f = frame_t[rows]  # [frames, c_f]
            return torch.cat([f[:, None, :].expand(frames, hw, -1),
                              hw_t[None, :, :].expand(frames, hw, -1)], dim=-1).reshape(frames * hw, -1)

        return table(self.frame_cos, self.hw_cos), table(self.frame_sin, self.hw_sin)

    def action(self, start_frame: torch.Tensor | int, frames: int) -> tuple[torch.Tensor, torch.Tensor]:
        """cos, sin [frames, ca] of the action attentions."""
        rows = _frame_rows(start_frame, frames, self.action_cos.device)
        return self.action_cos[rows], self.action_sin[rows]


def _frame_rows(start_frame: torch.Tensor | int, frames: int, device: torch.device) -> torch.Tensor:
    steps = torch.arange(frames, device=device)
    if isinstance(start_frame, torch.Tensor):
        return start_frame.reshape(1).to(device=device, dtype=torch.int64) + steps
    return steps + int(start_frame)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate interleaved pairs of x in fp32; returns x's dtype.

    x: [..., 2c]; cos, sin: fp32, broadcastable to x's pairs [..., c]
    (e.g. [S, 1, c] against x [B, S, H, 2c]).
    """
    xf = x.float().unflatten(-1, (-1, 2))  # [..., c, 2]
    a, b = xf[..., 0], xf[..., 1]
    out = torch.stack([a * cos - b * sin, a * sin + b * cos], dim=-1)
    return out.flatten(-2).to(x.dtype)
