"""The tiny video decoder (TAEHV's decoder, the ``taew2_1.pth`` weights for Wan2.1's latents), with its
per-block memory as explicit tensors.

A much smaller decoder than Wan2.1's VAE (9.8 M parameters against 73.3 M; no 3-D convolutions): 2-D
3x3 convolutions per frame, and nine memory blocks that each read their input beside the same input one
frame earlier. Module and parameter names equal TAEHV's (``decoder.N.*``), so the decoder part of
``taew2_1.pth`` loads strictly. It reads the DiT's latents as they are (normalised: no mean/std), and two
of its stages double the frames, so a latent frame yields 4 video frames.

A memory block's history is its input's last frame (``[B, C, h', w']``, zeros at a stream's start), so a
call is a pure function of (latents, histories) -> (frames, new histories), like the Wan decoder's:

    decoder = TinyDecoder()
    history = decoder.empty_history(batch=1, height=44, width=80)
    frames, history = decoder(z[:, :, :3], history, first=True)    # 3 latent frames -> 9 frames
    frames, history = decoder(z[:, :, 3:6], history, first=False)  # -> 12 frames

TAEHV's whole-clip decode drops its first 3 frames (2**2 - 1, the frames before the first latent frame's
own); a stream does that in its first call only, so a stream yields 1 + 4(T - 1) frames for T latent
frames, as the Wan decoder does. Frames leave as fp32 RGB in [-1, 1] (TAEHV's [0, 1], mapped).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

LATENT_CHANNELS = 16
WIDTHS = (256, 128, 64, 64)  # TAEHV's decoder: its stages' channels
TIME_SCALE = 4  # two of its stages double the frames


def conv(n_in: int, n_out: int, bias: bool = True) -> nn.Conv2d:
    return nn.Conv2d(n_in, n_out, 3, padding=1, bias=bias)


class Clamp(nn.Module):
    """A soft clamp of the latents to (-3, 3)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.tanh(x / 3) * 3


class MemBlock(nn.Module):
    """relu(convs([x ; x one frame earlier]) + x): the block that carries time."""

    def __init__(self, channels: int):
        super().__init__()
        self.conv = nn.Sequential(conv(2 * channels, channels), nn.ReLU(), conv(channels, channels), nn.ReLU(),
                                  conv(channels, channels))

    def forward(self, x: torch.Tensor, past: torch.Tensor) -> torch.Tensor:
        return F.relu(self.conv(torch.cat([x, past], 1)) + x)


class TGrow(nn.Module):
    """A 1x1 convolution to ``stride`` x the channels, read as ``stride`` frames per frame."""

    def __init__(self, channels: int, stride: int):
        super().__init__()
        self.stride = stride
        self.conv = nn.Conv2d(channels, channels * stride, 1, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        n, c, h, w = x.shape
        return self.conv(x).reshape(n * self.stride, c, h, w)


def _stage(channels: int, out: int, time_stride: int) -> list[nn.Module]:
    return [MemBlock(channels), MemBlock(channels), MemBlock(channels), nn.Upsample(scale_factor=2),
            TGrow(channels, time_stride), conv(channels, out, bias=False)]


class TinyDecoder(nn.Module):
    """Latents [B, 16, T, h, w] (the DiT's normalised latents) -> RGB in [-1, 1] [B, 3, T', 8h, 8w]."""

    def __init__(self, latent_channels: int = LATENT_CHANNELS):
        super().__init__()
        n = WIDTHS
        self.decoder = nn.Sequential(
            Clamp(), conv(latent_channels, n[0]), nn.ReLU(),
            *_stage(n[0], n[1], 1), *_stage(n[1], n[2], 2), *_stage(n[2], n[3], 2),
            nn.ReLU(), conv(n[3], 3))

    def video_frames(self, latent_frames: int, first: bool) -> int:
        """Video frames a call yields (the first call drops the first ``TIME_SCALE - 1``)."""
        return TIME_SCALE * latent_frames - (TIME_SCALE - 1 if first else 0)

    def use_engine_form(self) -> "TinyDecoder":
        """The decoder as its graphs hold it: its weights channels-last (the layout cuDNN's fast 2-D
        convolutions take). The arithmetic is the reference's. Returns self."""
        for module in self.modules():
            if isinstance(module, nn.Conv2d):
                module.weight.data = module.weight.data.contiguous(memory_format=torch.channels_last)
        return self

    def history_layout(self, batch: int, height: int, width: int) -> list[tuple[str, tuple[int, ...]]]:
        """(module path, [B, C, h', w']) of each memory block's history, in call order, for latents h x w."""
        layout, scale = [], 1
        for i, layer in enumerate(self.decoder):
            if isinstance(layer, MemBlock):
                channels = layer.conv[2].in_channels
                layout.append((f"decoder.{i}", (batch, channels, height * scale, width * scale)))
            elif isinstance(layer, nn.Upsample):
                scale *= 2
        return layout

    def empty_history(self, batch: int, height: int, width: int, dtype: torch.dtype | None = None,
                      device: str | torch.device | None = None) -> list[torch.Tensor]:
        """Zero histories: the state at the start of a stream."""
        weight = self.decoder[1].weight
        return [torch.zeros(shape, dtype=dtype or weight.dtype, device=device or weight.device)
                for _, shape in self.history_layout(batch, height, width)]

    def forward(self, z: torch.Tensor, history: list[torch.Tensor], first: bool
                ) -> tuple[torch.Tensor, list[torch.Tensor]]:
        """Decode latent frames ``z`` [B, 16, T, h, w] after ``history``; ``first``: z starts the stream.

        Returns RGB frames [B, 3, T', 8h, 8w] (T' = :meth:`video_frames`), clamped to [-1, 1] in fp32, and
        the updated histories.
        """
        b, _, t = z.shape[:3]
        x = z.to(self.decoder[1].weight.dtype).transpose(1, 2).flatten(0, 1)  # frames [B * T, 16, h, w]
        histories, out = iter(history), []
        for layer in self.decoder:
            if isinstance(layer, MemBlock):
                frames = x.unflatten(0, (b, -1))  # [B, T', C, h', w']
                past = torch.cat([next(histories).unsqueeze(1).to(x.dtype), frames[:, :-1]], 1)
                out.append(frames[:, -1])
                x = layer(x, past.flatten(0, 1))
            else:
                x = layer(x)
        frames = x.unflatten(0, (b, -1))
        if first:
            frames = frames[:, TIME_SCALE - 1:]
        rgb = frames.transpose(1, 2).float().mul(2).sub(1).clamp(-1, 1).contiguous()
        return rgb, out
