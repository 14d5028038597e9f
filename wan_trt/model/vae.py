"""The Wan2.1 causal video VAE decoder (16-channel latents -> RGB, x4 in time, x8 in space),
with its causal-convolution history as explicit tensors.

Module and parameter names equal upstream's (``conv2.*`` and ``decoder.*`` of ``Wan2.1_VAE.pth``).
Upstream decodes a clip latent frame by latent frame, carrying a list of feature caches: every
causal convolution with a 3-frame temporal kernel (32 of them) keeps the last 2 frames of its
input. Here each of those histories is a tensor ``[B, C, 2, h, w]`` that starts as zeros (a
causal convolution's zero padding) and is returned updated, so a call is a pure function of
(latents, histories) -> (frames, new histories), the form a static graph needs:

    decoder = VideoDecoder(DecoderConfig())
    history = decoder.empty_history(batch=1, height=44, width=80)
    frames, history = decoder(z[:, :, :1], history, first=True)    # latent frame 0 -> 1 frame
    frames, history = decoder(z[:, :, 1:3], history, first=False)  # 2 latent frames -> 8 frames

Upstream's first-frame rule: the stream's first latent frame skips both temporal upsampling
convolutions (it yields one video frame, later latent frames four each), and it is not part of
their history (upstream marks the cache 'Rep' and later pads with zeros), so those two
histories stay zero after a ``first`` call.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import nn

from wan_trt.errors import WanTrtError

# Upstream's latent statistics: the DiT's latents are normalised, the decoder takes z * std + mean.
LATENT_MEAN = (-0.7571, -0.7089, -0.9113, 0.1075, -0.1745, 0.9653, -0.1517, 1.5508,
               0.4134, -0.0715, 0.5517, -0.3632, -0.1922, -0.9497, 0.2503, -0.2921)
LATENT_STD = (2.8184, 1.4541, 2.3275, 2.6558, 1.2196, 1.7708, 2.6052, 2.0743,
              3.2687, 2.1526, 2.8652, 1.5579, 1.6382, 1.1253, 2.8251, 1.9160)
HISTORY_FRAMES = 2  # frames each 3-frame causal convolution keeps (upstream CACHE_T)


@dataclass(frozen=True)
class DecoderConfig:
    """Shape of the decoder. Defaults: Wan2.1's (dim 96: 73.3 M parameters)."""

    dim: int = 96
    z_dim: int = 16
    dim_mult: tuple[int, ...] = (1, 2, 4, 4)
    num_res_blocks: int = 2
    temporal_upsample: tuple[bool, ...] = (True, True, False)  # upstream: temperal_downsample reversed

    @property
    def time_scale(self) -> int:
        return 2 ** sum(self.temporal_upsample)

    def video_frames(self, latent_frames: int, first: bool) -> int:
        """Video frames a call yields: the first latent frame 1, every other ``time_scale``."""
        return (1 + self.time_scale * (latent_frames - 1)) if first else self.time_scale * latent_frames


def latent_statistics(cfg: DecoderConfig) -> tuple[torch.Tensor, torch.Tensor]:
    """Upstream's per-channel latent mean and std, [1, z_dim, 1, 1, 1] fp32 on the CPU."""
    return tuple(torch.tensor(v[:cfg.z_dim], device="cpu").view(1, -1, 1, 1, 1) for v in (LATENT_MEAN, LATENT_STD))


class CausalConv3d(nn.Conv3d):
    """A 3D convolution causal in time: the ``2 * padding_t`` frames before the input come from
    ``history`` (zeros at the start of a stream), and the same number of last frames of
    ``[history ; x]`` is the next history."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        pt, ph, pw = self.padding
        self.history_frames = 2 * pt
        self.spatial_pad = (pw, pw, ph, ph, 0, 0)
        self.padding = (0, 0, 0)
        self.engine_form = False  # see VideoDecoder.use_engine_form
        self.split_at = 0  # see split_outputs
        self.taps = False  # the engine form as forward_taps (the decoder's head)

    def forward(self, x: torch.Tensor, history: torch.Tensor | None = None
                ) -> tuple[torch.Tensor, torch.Tensor | None]:
        if self.history_frames:
            history = history.to(x.dtype)
            if self.engine_form:  # a concatenation of channels-last halves is channels-last: no copy after it
                history, x = (t.contiguous(memory_format=torch.channels_last_3d) for t in (history, x))
            x = torch.cat([history, x], dim=2)
            history = self.next_history(x)
        if self.engine_form and self.taps:
            return self.forward_taps(x.contiguous(memory_format=torch.channels_last_3d)), history
        if self.engine_form:
            y = self._engine_conv(x.contiguous(memory_format=torch.channels_last_3d), self.bias)
            return y[:, :self.out_channels] if y.shape[1] != self.out_channels else y, history
        return super().forward(F.pad(x, self.spatial_pad)), history

    def _engine_conv(self, joined: torch.Tensor, bias: torch.Tensor | None, weight: torch.Tensor | None = None
                     ) -> torch.Tensor:
        """The engine form's convolution of a channels-last input that starts with its history: the border
        zeros are the convolution's own padding, not a padded copy. ``weight``: some of the filters."""
        pw, _, ph = self.spatial_pad[:3]
        return F.conv3d(joined, self.weight if weight is None else weight, bias, self.stride, (0, ph, pw))

    def forward_joined(self, joined: torch.Tensor) -> "tuple[torch.Tensor | Split, torch.Tensor]":
        """Engine form, on an input that already starts with its history (``[history ; x]``, channels
        last): (the output before its bias, with any padded channels, or as a :class:`Split` after
        :meth:`split_outputs`; and the next history)."""
        if self.split_at:
            y = Split(*(self._engine_conv(joined, None, w) for w in (self.head_weight, self.tail_weight)))
        else:
            y = self._engine_conv(joined, None)
        return y, self.next_history(joined)

    def split_outputs(self) -> None:
        """Engine form with the fused norms: over 128 output channels and not a multiple of 128 (the
        quarter resolution's 192) compute as two convolutions, the multiple of 128 and the rest, whose
        outputs the next norm reads as they are (:class:`Split`). cuDNN tiles output channels by 128:
        a 192-channel convolution ran a 128-wide tile of which half was dropped, 128 + 64 runs 6 %
        faster (2.11 vs 2.24 ms at 176x320 on an H100). After :meth:`use_engine_form`, once the weights
        are loaded (the two parts are copies of them); once."""
        c = self.out_channels
        if self.split_at or c <= 128 or c % 128 == 0:
            return
        self.split_at = c - c % 128
        for name, w in (("head_weight", self.weight[:self.split_at]), ("tail_weight", self.weight[self.split_at:])):
            self.register_buffer(name, w.contiguous(memory_format=torch.channels_last_3d), persistent=False)

    def next_history(self, joined: torch.Tensor) -> torch.Tensor:
        """The history the next call takes: the last frames of this call's ``[history ; x]``."""
        return joined[:, :, -self.history_frames:]

    def forward_taps(self, joined: torch.Tensor) -> torch.Tensor:
        """Engine form of the head's convolution (``taps``: its 3 outputs, which cuDNN computes as 64):
        one GEMM of the input (its history included, channels last) with every tap's weights, then the
        sum of the taps' shifted products in fp32, plus the bias. Returns the fp32 output. Only the head:
        27 slices and adds each, so a decoder whose every narrow convolution took this form (a small
        ``vae_dim``) made graphs of thousands of slices that the ONNX exporter's optimizer never finished."""
        kt, kh, kw = self.kernel_size
        pw, _, ph = self.spatial_pad[:3]
        b, c, frames, h, w = joined.shape
        co, t = self.out_channels, frames - kt + 1
        taps = self.weight[:co].permute(2, 3, 4, 0, 1).reshape(-1, c)  # [(kt, kh, kw, co), c]
        pixels = joined.permute(0, 2, 3, 4, 1).reshape(-1, c)  # channels last: a view
        products = torch.mm(taps, pixels.t()).view(kt, kh, kw, co, b, frames, h, w)
        products = F.pad(products, (pw, pw, ph, ph))
        out = self.bias[:co].float().view(co, 1, 1, 1, 1)
        for dt in range(kt):
            for dh in range(kh):
                for dw in range(kw):
                    out = out + products[dt, dh, dw, :, :, dt:dt + t, dh:dh + h, dw:dw + w].float()
        return out.transpose(0, 1)

    def use_engine_form(self) -> None:
        """Channels-last weights; 65 to 127 output channels padded with zero filters to 128 (one tile
        of cuDNN's kernels instead of a wide and a narrow one; the extra outputs are dropped). Once."""
        if self.engine_form:
            return
        extra = 128 - self.out_channels if 64 < self.out_channels < 128 else 0
        if extra:
            self.weight.data = torch.cat([self.weight.data, self.weight.data.new_zeros(extra, *self.weight.shape[1:])])
            self.bias.data = torch.cat([self.bias.data, self.bias.data.new_zeros(extra)])
        self.weight.data = self.weight.data.contiguous(memory_format=torch.channels_last_3d)
        self.engine_form = True


class RMS_norm(nn.Module):  # noqa: N801  (upstream's name, kept for the checkpoint's module paths)
    """L2-normalise over channels, times sqrt(C) and a learned gain (upstream ``RMS_norm``, no bias)."""

    def __init__(self, dim: int, images: bool = True):
        super().__init__()
        self.scale = dim ** 0.5
        self.gamma = nn.Parameter(torch.ones(dim, *((1, 1) if images else (1, 1, 1))))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.normalize(x, dim=1) * self.scale * self.gamma


class Upsample(nn.Upsample):
    """Nearest-exact x2 in space, computed in fp32 (upstream: bf16 has no such kernel)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return super().forward(x.float()).type_as(x)


class Resample(nn.Module):
    """x2 in space (``upsample2d``), and x2 in time too (``upsample3d``: a causal time convolution
    with 2C outputs, interleaved as two frames per input frame)."""

    def __init__(self, dim: int, mode: str):
        super().__init__()
        if mode not in ("upsample2d", "upsample3d"):
            raise WanTrtError(f"decoder resample mode {mode!r}: expected upsample2d or upsample3d")
        self.mode = mode
        self.resample = nn.Sequential(Upsample(scale_factor=(2.0, 2.0), mode="nearest-exact"),
                                      nn.Conv2d(dim, dim // 2, 3, padding=1))
        if mode == "upsample3d":
            self.time_conv = CausalConv3d(dim, dim * 2, (3, 1, 1), padding=(1, 0, 0))
        self.engine_form = False  # see use_engine_form
        self.fused = False  # see VideoDecoder.use_engine_form: returns its output before the bias, Pending

    def forward(self, x: torch.Tensor, histories: "Histories", first: bool) -> "torch.Tensor | Pending":
        if self.mode == "upsample3d":
            x = self._upsample_time(x, histories, first)
        b, c, t, h, w = x.shape
        frames = x.transpose(1, 2).reshape(b * t, c, h, w)
        if not self.engine_form:
            return self._video(self.resample(frames), b, t)
        if not self.fused:
            return self._video(self._upsample_transposed(frames, bias=True), b, t)
        return Pending(self._video(self._upsample_transposed(frames, bias=False), b, t), self.resample[1].bias, None)

    @staticmethod
    def _video(frames: torch.Tensor, b: int, t: int) -> torch.Tensor:
        """[b t, c, h, w] frames -> [b, c, t, h, w] (a view)."""
        return frames.reshape(b, t, *frames.shape[1:]).transpose(1, 2)

    def use_engine_form(self) -> None:
        """Nearest x2 then a 3x3 convolution is a transposed convolution of the low-res frame with
        stride 2 and 4x4 weights: each output row 2i + a draws on 2 low-res rows (a = 0: rows i - 1
        and i; a = 1: rows i and i + 1), the 3 taps that land on one low-res row adding up. So 16
        multiply-adds per low-res pixel and channel pair instead of 36, no upsampled copy of the input,
        and the output written in place (no interleaving of phases). The weights are summed in fp32
        and rounded once. Once."""
        if self.engine_form:
            return
        conv = self.resample[1]
        # [transposed tap k, 3x3 tap u]: transposed tap k feeds output row 2i + k - 1 from low-res row i
        taps = torch.tensor([[0, 0, 1], [0, 1, 1], [1, 1, 0], [1, 0, 0]], dtype=torch.float32,
                            device=conv.weight.device)
        weight = torch.einsum("ku,lv,ocuv->cokl", taps, taps, conv.weight.float())  # [c, co, 4, 4]
        self.register_buffer("upsample_weight", weight.to(conv.weight.dtype).contiguous(
            memory_format=torch.channels_last), persistent=False)
        self.engine_form = True

    def _upsample_transposed(self, frames: torch.Tensor, bias: bool) -> torch.Tensor:
        """Engine form of ``self.resample`` (:meth:`use_engine_form`): [n, c, h, w] -> [n, c/2, 2h, 2w],
        with its bias or without."""
        return F.conv_transpose2d(frames, self.upsample_weight, self.resample[1].bias if bias else None,
                                  stride=2, padding=1)

    def _upsample_time(self, x: torch.Tensor, histories: "Histories", first: bool) -> torch.Tensor:
        history = histories.take()
        head, rest = (x[:, :, :1], x[:, :, 1:]) if first else (x[:, :, :0], x)
        if rest.shape[2] == 0:  # only the stream's first frame: no time conv, history unchanged
            histories.give(history)
            return head
        y, history = self.time_conv(rest, history)
        histories.give(history)
        b, c2, t, h, w = y.shape
        y = y.reshape(b, 2, c2 // 2, t, h, w).permute(0, 2, 3, 1, 4, 5).reshape(b, c2 // 2, 2 * t, h, w)
        return torch.cat([head, y], dim=2)


class Split(NamedTuple):
    """A convolution's output computed as two convolutions (:meth:`CausalConv3d.split_outputs`): its first
    ``head.shape[1]`` channels and the rest, not joined; the fused norms read both."""
    head: torch.Tensor
    tail: torch.Tensor

    @property
    def dtype(self) -> torch.dtype:
        return self.head.dtype

    def joined(self) -> torch.Tensor:
        return torch.cat([self.head, self.tail], dim=1)


class Pending(NamedTuple):
    """An output in the fused form, not yet summed: a convolution's output before its bias (with any
    padded channels, or a :class:`Split`), its bias, and the shortcut to add (a residual block's) or
    None (an upsampling's). The next norm sums it."""
    y: "torch.Tensor | Split"
    bias: torch.Tensor
    shortcut: torch.Tensor | None

    def total(self) -> torch.Tensor:
        y = self.y.joined() if isinstance(self.y, Split) else self.y
        if self.shortcut is None:
            return y + self.bias.view(-1, 1, 1, 1)
        c = self.shortcut.shape[1]
        return y[:, :c] + self.bias[:c].view(-1, 1, 1, 1) + self.shortcut

    @staticmethod
    def residual(y: "torch.Tensor | Split", bias: torch.Tensor, shortcut: "torch.Tensor | Pending") -> "Pending":
        """y + bias + shortcut, unsummed. A shortcut that is itself an unsummed upsampling adds its bias to
        ``bias`` (rounded once, in the bias's dtype): the sum then reads the upsampling's output as is."""
        if isinstance(shortcut, Pending):
            if shortcut.shortcut is not None:
                raise ValueError("a residual shortcut is a tensor or an upsampling's unsummed output")
            return Pending(y, bias + F.pad(shortcut.bias, (0, bias.shape[0] - shortcut.bias.shape[0])), shortcut.y)
        return Pending(y, bias, shortcut)


def _channels_last(t: torch.Tensor) -> torch.Tensor:
    return t.contiguous(memory_format=torch.channels_last_3d)


def channels_last_3d_strides(size) -> list[int]:
    """The strides of a [N, C, D, H, W] tensor stored channels-last ([N, D, H, W, C]), the decoder's
    activation layout in its engine form."""
    _, c, d, h, w = size
    return [d * h * w * c, 1, h * w * c, w * c, c]


def fused_norm_join(norm: "RMS_norm", x: "torch.Tensor | Split | Pending", bias: torch.Tensor | None,
                    history: torch.Tensor) -> tuple[torch.Tensor, "torch.Tensor | Split | Pending"]:
    """Fused form of norm -> SiLU -> a causal convolution's join with its history, on ``x`` plus
    ``bias`` (a convolution's output before its bias) or on a pending sum (its own bias).
    Returns (the convolution's input ``[history ; silu(norm(x))]`` [B, C, 2 + T, h, w] channels-last,
    and x, the residual sum, or a pending upsampling's output as it came)."""
    gamma = norm.gamma.view(-1)
    pending = isinstance(x, Pending)
    y = x.y if pending else x
    history = _channels_last(history.to(y.dtype))
    if pending:
        if bias is not None:
            raise ValueError("a pending sum carries its own bias")
        if x.shortcut is None:  # an upsampling's output: summed where it is read
            return _fused_norm("norm_silu_join", y, x.bias, gamma, history), x
        total, joined = _fused_norm("add_norm_silu_join", y, x.bias, _channels_last(x.shortcut), gamma, history)
        return joined, total
    if bias is None:  # x carries its bias already
        parts = y if isinstance(y, Split) else (y,)
        bias = parts[0].new_zeros(sum(p.shape[1] for p in parts))
    return _fused_norm("norm_silu_join", y, bias, gamma, history), x


def _fused_norm(op: str, y: "torch.Tensor | Split", *args: torch.Tensor):
    """``torch.ops.wan_trt.<op>`` of y (channels-last), or its ``split_`` variant of a Split's two parts."""
    if isinstance(y, Split):
        return getattr(torch.ops.wan_trt, f"split_{op}")(_channels_last(y.head), _channels_last(y.tail), *args)
    return getattr(torch.ops.wan_trt, op)(_channels_last(y), *args)


def summed(x: torch.Tensor | Pending) -> torch.Tensor:
    return x.total() if isinstance(x, Pending) else x


class ResidualBlock(nn.Module):
    fused = False  # see VideoDecoder.use_engine_form: returns a Pending sum

    def __init__(self, in_dim: int, out_dim: int):
        super().__init__()
        self.residual = nn.Sequential(
            RMS_norm(in_dim, images=False), nn.SiLU(), CausalConv3d(in_dim, out_dim, 3, padding=1),
            RMS_norm(out_dim, images=False), nn.SiLU(), nn.Dropout(0.0), CausalConv3d(out_dim, out_dim, 3, padding=1))
        self.shortcut = CausalConv3d(in_dim, out_dim, 1) if in_dim != out_dim else None

    def forward(self, x: torch.Tensor | Pending, histories: "Histories") -> torch.Tensor | Pending:
        if self.fused:
            return self._forward_fused(x, histories)
        h = x if self.shortcut is None else self.shortcut(x)[0]
        for layer in self.residual:
            if isinstance(layer, CausalConv3d):
                x, new = layer(x, histories.take())
                histories.give(new)
            else:
                x = layer(x)
        return x + h

    def _forward_fused(self, x: torch.Tensor | Pending, histories: "Histories") -> Pending:
        norm1, _, conv1, norm2, _, _, conv2 = self.residual
        joined, x = fused_norm_join(norm1, x, None, histories.take())
        h = x if self.shortcut is None else self.shortcut(summed(x))[0]
        y, new = conv1.forward_joined(joined)
        histories.give(new)
        joined, _ = fused_norm_join(norm2, y, conv1.bias, histories.take())
        y, new = conv2.forward_joined(joined)
        histories.give(new)
        return Pending.residual(y, conv2.bias, h)


class AttentionBlock(nn.Module):
    """Single-head self-attention over the pixels of each frame (no mixing across time)."""

    def __init__(self, dim: int):
        super().__init__()
        self.norm = RMS_norm(dim)
        self.to_qkv = nn.Conv2d(dim, dim * 3, 1)
        self.proj = nn.Conv2d(dim, dim, 1)
        self.engine_form = False  # see VideoDecoder.use_engine_form

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, c, t, h, w = x.shape
        y = self.norm(x.transpose(1, 2).reshape(b * t, c, h, w))
        q, k, v = self.to_qkv(y).reshape(b * t, 1, 3 * c, h * w).transpose(2, 3).chunk(3, dim=-1)
        if self.engine_form:  # products in the weights' dtype, softmax in fp32 (a graph's generic attention
            # computes all in fp32, for a head too wide for the flash kernels)
            scores = torch.matmul(q, k.transpose(-1, -2)).float() * c ** -0.5
            y = torch.matmul(torch.softmax(scores, dim=-1).to(v.dtype), v)
        else:
            y = F.scaled_dot_product_attention(q, k, v)
        y = y.squeeze(1).transpose(1, 2).reshape(b * t, c, h, w)
        y = self.proj(y)
        return x + y.reshape(b, t, c, h, w).transpose(1, 2)


class Histories:
    """The causal convolutions' histories in call order: ``take`` the next one, ``give`` its update."""

    def __init__(self, tensors: list[torch.Tensor]):
        self._in, self.out = iter(tensors), []

    def take(self) -> torch.Tensor:
        return next(self._in)

    def give(self, tensor: torch.Tensor) -> None:
        self.out.append(tensor)


class Decoder3d(nn.Module):
    """conv1 -> middle (res, attention, res) -> upsample stages -> head (upstream ``Decoder3d``)."""

    fused = False  # see VideoDecoder.use_engine_form: the residual blocks return Pending sums

    def __init__(self, cfg: DecoderConfig):
        super().__init__()
        dims = [cfg.dim * u for u in (cfg.dim_mult[-1], *cfg.dim_mult[::-1])]
        self.conv1 = CausalConv3d(cfg.z_dim, dims[0], 3, padding=1)
        self.middle = nn.Sequential(ResidualBlock(dims[0], dims[0]), AttentionBlock(dims[0]),
                                    ResidualBlock(dims[0], dims[0]))
        upsamples = []
        for i, (in_dim, out_dim) in enumerate(zip(dims[:-1], dims[1:])):
            in_dim = in_dim // 2 if i > 0 else in_dim  # the previous stage's resample halved the channels
            for _ in range(cfg.num_res_blocks + 1):
                upsamples.append(ResidualBlock(in_dim, out_dim))
                in_dim = out_dim
            if i != len(cfg.dim_mult) - 1:
                upsamples.append(Resample(out_dim, "upsample3d" if cfg.temporal_upsample[i] else "upsample2d"))
        self.upsamples = nn.Sequential(*upsamples)
        self.head = nn.Sequential(RMS_norm(dims[-1], images=False), nn.SiLU(), CausalConv3d(dims[-1], 3, 3, padding=1))

    def forward(self, x: torch.Tensor, histories: Histories, first: bool) -> torch.Tensor:
        x, new = self.conv1(x, histories.take())
        histories.give(new)
        for layer in (*self.middle, *self.upsamples):
            if isinstance(layer, ResidualBlock):
                x = layer(x, histories)  # a Pending sum in the fused form
            elif isinstance(layer, Resample):
                x = layer(summed(x), histories, first)
            else:
                x = layer(summed(x))
        norm, silu, conv = self.head
        if self.fused:  # the head (3 outputs) in the taps form, as CausalConv3d.forward runs it
            joined, _ = fused_norm_join(norm, x, None, histories.take())
            histories.give(conv.next_history(joined))
            return conv.forward_taps(joined)
        x, new = conv(silu(norm(x)), histories.take())
        histories.give(new)
        return x


class VideoDecoder(nn.Module):
    """Latents [B, 16, T, h, w] (the DiT's normalised latents) -> RGB in [-1, 1] [B, 3, T', 8h, 8w]."""

    def __init__(self, cfg: DecoderConfig = DecoderConfig()):
        super().__init__()
        self.cfg = cfg
        self.conv2 = CausalConv3d(cfg.z_dim, cfg.z_dim, 1)
        self.decoder = Decoder3d(cfg)
        mean, std = latent_statistics(cfg)
        self.register_buffer("mean", mean, persistent=False)
        self.register_buffer("std", std, persistent=False)

    def use_engine_form(self, fused: bool = False) -> "VideoDecoder":
        """The decoder as its graphs hold it: the same arithmetic, arranged for speed. Weights are
        converted in place (the PyTorch references stay unprepared). Returns self.

        - the 3D convolutions run channels-last (NDHWC): cuDNN's fast kernels take that layout, and
          without it every convolution transposes its input and output;
        - each joins its history and its input channels-last, so the joined input needs no copy
          into that layout;
        - each pads its input's borders with zeros itself, instead of reading a padded copy;
        - those with 65 to 127 output channels compute 128 (:meth:`CausalConv3d.use_engine_form`);
        - the x2 upsamplings are transposed convolutions of the low-res frames (stride 2, 4x4 weights),
          2.25x fewer multiply-adds and no upsampled copy (:meth:`Resample.use_engine_form`);
        - the attention block multiplies in the weights' dtype, with its softmax in fp32;
        - the head's convolution (3 outputs) is one GEMM with all its taps and a sum of shifted slices
          (:meth:`CausalConv3d.forward_taps`).

        ``fused``: the residual blocks' and the head's norms run as the fused ops ``norm_silu_join`` and
        ``add_norm_silu_join`` (``plugins/decoder_norm.py``): each adds the convolution's bias (and
        the residual sum) and writes the next convolution's joined input in one pass. The upsamplings
        then hand their output on before its bias (:class:`Pending`): the next norm adds it, and the
        residual sum after it takes it into its own bias, so the output is never rewritten with it.
        The residual blocks' 192-channel convolutions then compute as 128 + 64, read by the ``split_``
        variants of those ops (:meth:`CausalConv3d.split_outputs`).

        cuDNN may pick other kernels for these forms, so roundings can differ from the reference.
        """
        if fused:
            import wan_trt.plugins.ops  # noqa: F401  (registers torch.ops.wan_trt.*; deferred: it needs Triton)
        for module in self.modules():
            if isinstance(module, CausalConv3d):
                module.use_engine_form()
            elif isinstance(module, AttentionBlock):
                module.engine_form = True
            elif isinstance(module, Resample):
                module.use_engine_form()
            if isinstance(module, (ResidualBlock, Decoder3d, Resample)):
                module.fused = fused
        self.decoder.head[2].taps = True  # 3 outputs: by taps (its own 27 shifted slices); no other convolution
        for block in self.modules() if fused else ():  # their outputs go to the fused norms only
            if isinstance(block, ResidualBlock):
                block.residual[2].split_outputs()
                block.residual[6].split_outputs()
        return self

    def video_frames(self, latent_frames: int, first: bool) -> int:
        """Video frames a call yields (:meth:`DecoderConfig.video_frames`)."""
        return self.cfg.video_frames(latent_frames, first)

    def history_layout(self, batch: int, height: int, width: int) -> list[tuple[str, tuple[int, ...]]]:
        """(module path, [B, C, 2, h', w']) of each causal convolution's history, in call order, for
        latents h x w."""
        layout, scale = [], 1

        def conv(path: str, c: CausalConv3d) -> None:
            layout.append((path, (batch, c.in_channels, HISTORY_FRAMES, height * scale, width * scale)))

        conv("decoder.conv1", self.decoder.conv1)
        stages = [(f"decoder.middle.{i}", m) for i, m in enumerate(self.decoder.middle)]
        stages += [(f"decoder.upsamples.{i}", m) for i, m in enumerate(self.decoder.upsamples)]
        for path, layer in stages:
            if isinstance(layer, ResidualBlock):
                conv(f"{path}.residual.2", layer.residual[2])
                conv(f"{path}.residual.6", layer.residual[6])
            elif isinstance(layer, Resample):
                if layer.mode == "upsample3d":
                    conv(f"{path}.time_conv", layer.time_conv)
                scale *= 2
        conv("decoder.head.2", self.decoder.head[2])
        return layout

    def history_shapes(self, batch: int, height: int, width: int) -> list[tuple[int, ...]]:
        """[B, C, 2, h', w'] of each causal convolution's history, in call order, for latents h x w."""
        return [shape for _, shape in self.history_layout(batch, height, width)]

    def empty_history(self, batch: int, height: int, width: int, dtype: torch.dtype | None = None,
                      device: str | torch.device | None = None) -> list[torch.Tensor]:
        """Zero histories: the state at the start of a stream."""
        dtype = dtype or self.conv2.weight.dtype
        device = device or self.conv2.weight.device
        return [torch.zeros(s, dtype=dtype, device=device) for s in self.history_shapes(batch, height, width)]

    def forward(self, z: torch.Tensor, history: list[torch.Tensor], first: bool
                ) -> tuple[torch.Tensor, list[torch.Tensor]]:
        """Decode latent frames ``z`` [B, 16, T, h, w] after ``history``; ``first``: z starts the stream.

        Returns RGB frames [B, 3, T', 8h, 8w] (T' = :meth:`DecoderConfig.video_frames`), clamped to
        [-1, 1] in fp32, and the updated histories.
        """
        z = z.to(self.std.dtype) * self.std + self.mean
        x, _ = self.conv2(z.to(self.conv2.weight.dtype))
        histories = Histories(history)
        out = self.decoder(x, histories, first)
        return out.float().clamp(-1, 1), histories.out
