"""What a stream consumes: conditioning, raw action frames, noise; and the action windows.

Raw actions run at video rate: block 0 covers ``1 + 4*(F-1)`` = 9 raw frames, every
later block ``4*F`` = 12. The history is padded at the start with 12 copies of raw
frame 0; latent frame ``j`` sees padded raw frames ``[4j, 4j + 12)`` (upstream's
window, which ends one raw frame before the frame that latent j decodes to).
"""
from __future__ import annotations

import numbers
from dataclasses import dataclass

import torch

from wan_trt.config import WanConfig
from wan_trt.errors import WanTrtError
from wan_trt.rotary import MAX_STREAM_FRAMES


def raw_frames_in_block(cfg: WanConfig, block: int) -> int:
    """New raw action frames of ``block`` (9 for block 0, then 12)."""
    ratio = cfg.model.action_config.vae_time_compression_ratio
    f = cfg.block_frames
    return 1 + ratio * (f - 1) if block == 0 else ratio * f


def raw_frames_until(cfg: WanConfig, blocks: int) -> int:
    """Raw action frames of the first ``blocks`` blocks (upstream ``1 + 4*(start + F - 1)``)."""
    ratio = cfg.model.action_config.vae_time_compression_ratio
    return 1 + ratio * (blocks * cfg.block_frames - 1)


def first_raw_frame(cfg: WanConfig, block: int) -> int:
    """Index of the first new raw action frame of ``block`` (0, then 12 * block - 3)."""
    return raw_frames_until(cfg, block + 1) - raw_frames_in_block(cfg, block)


def max_stream_blocks(cfg: WanConfig) -> int:
    """How many blocks from block 0 a stream can reach (:data:`~wan_trt.rotary.MAX_STREAM_FRAMES`)."""
    return MAX_STREAM_FRAMES // cfg.block_frames


class ActionHistory:
    """The raw action frames of one stream, padded at the start and trimmed as blocks pass.

    Holds padded raw frames from absolute padded index ``base`` on, so memory stays
    bounded however long the stream runs. A stream that starts at a later block starts
    with ``base`` = the first raw frame it sees (:func:`first_raw_frame`): its start
    padding then stands in for every earlier raw frame, as it does for block 0.
    """

    def __init__(self, window: int = 12, ratio: int = 4, base: int = 0):
        self.window, self.ratio = window, ratio
        self.frames: torch.Tensor | None = None  # [B, n, D] padded raw frames from ``base``
        self.base = base

    def append(self, raw: torch.Tensor) -> None:
        """Add raw frames [B, n, D]; the first call also writes the 12-frame start padding."""
        if self.frames is None:
            self.frames = torch.cat([raw[:, :1].expand(-1, self.window, -1), raw], dim=1)
        else:
            self.frames = torch.cat([self.frames, raw.to(self.frames)], dim=1)

    def appended(self, raw: torch.Tensor) -> "ActionHistory":
        """A new history with raw frames [B, n, D] added; this one is left as it is."""
        new = ActionHistory(self.window, self.ratio, self.base)
        new.frames = self.frames
        new.append(raw)
        return new

    def windows(self, start_frame: int, frames: int) -> torch.Tensor:
        """[B, frames, 12, D]: latent frame j sees padded raw frames [4j, 4j + 12)."""
        assert self.frames is not None, "append raw frames first"
        first = self.ratio * start_frame - self.base
        end = first + self.ratio * (frames - 1) + self.window
        if first < 0 or end > self.frames.shape[1]:
            raise WanTrtError(f"the block at latent frame {start_frame} needs padded raw action frames "
                              f"[{first + self.base}, {end + self.base}); have [{self.base}, "
                              f"{self.base + self.frames.shape[1]})")
        return torch.stack([self.frames[:, first + self.ratio * i:first + self.ratio * i + self.window]
                            for i in range(frames)], dim=1)

    def trim(self, next_start_frame: int) -> None:
        """Drop frames no window from latent frame ``next_start_frame`` on will read."""
        drop = self.ratio * next_start_frame - self.base
        if self.frames is not None and drop > 0:
            self.frames = self.frames[:, drop:].clone()
            self.base += drop


@dataclass
class StreamInputs:
    """Everything a stream is conditioned on, from block ``first_block`` on.

    cond_concat: [B, 20, F_total, H, W] of the blocks from ``first_block``; visual_context:
    [B, 257, 1280]; mouse / keyboard: [B, N_raw, D] raw action frames from the first one of
    ``first_block`` on (:meth:`first_raw_frame`; None when disabled).
    """

    cond_concat: torch.Tensor
    visual_context: torch.Tensor
    mouse: torch.Tensor | None
    keyboard: torch.Tensor | None
    first_block: int = 0

    def block_cond(self, cfg: WanConfig, block: int) -> torch.Tensor:
        f, first = cfg.block_frames, block - self.first_block
        if first < 0 or (first + 1) * f > self.cond_concat.shape[2]:
            raise WanTrtError(f"these stream inputs hold blocks {self.first_block} .. "
                              f"{self.first_block + self.cond_concat.shape[2] // f - 1}, not block {block}")
        return self.cond_concat[:, :, first * f:(first + 1) * f]

    def first_raw_frame(self, cfg: WanConfig) -> int:
        """Absolute index of the first raw action frame held (0 for inputs from block 0)."""
        return first_raw_frame(cfg, self.first_block)

    def block_actions(self, cfg: WanConfig, block: int) -> tuple[torch.Tensor | None, torch.Tensor | None]:
        """The new raw frames of ``block`` (what a live user would send for it)."""
        end = raw_frames_until(cfg, block + 1) - self.first_raw_frame(cfg)
        start = end - raw_frames_in_block(cfg, block)
        if start < 0:
            raise WanTrtError(f"these stream inputs start at block {self.first_block}, not block {block}")
        return tuple(None if h is None else h[:, start:end] for h in (self.mouse, self.keyboard))


def synthetic_stream(cfg: WanConfig, blocks: int, seed: int = 0, *, first_block: int = 0) -> StreamInputs:
    """Deterministic, plausible inputs of blocks ``first_block`` .. ``first_block + blocks - 1``: mask 1 on
    frame 0 only, random image latents, one-hot-ish keyboard presses and +-0.1 camera moves held for
    12 raw frames (as upstream's demo)."""
    gen = torch.Generator().manual_seed(seed)
    m, a = cfg.model, cfg.model.action_config
    frames = blocks * cfg.block_frames
    h, w = cfg.inference.latent_height, cfg.inference.latent_width
    mask = torch.zeros(1, 4, frames, h, w)
    if first_block == 0:
        mask[:, :, 0] = 1
    image = torch.randn(1, m.out_dim, frames, h, w, generator=gen)
    visual = torch.randn(1, m.clip_tokens, m.clip_dim, generator=gen)
    n_raw = raw_frames_until(cfg, first_block + blocks) - first_raw_frame(cfg, first_block)
    held = (n_raw + 11) // 12

    def held_actions(dim: int, values: torch.Tensor) -> torch.Tensor:
        pick = values[torch.randint(0, values.shape[0], (held,), generator=gen)]
        return pick.repeat_interleave(12, dim=0)[:n_raw][None, :, :dim]

    mouse = keyboard = None
    if cfg.has_mouse:
        moves = torch.tensor([[0.0, 0.0], [0.1, 0.0], [-0.1, 0.0], [0.0, 0.1], [0.0, -0.1]])
        mouse = held_actions(a.mouse_dim_in, moves if a.mouse_dim_in == 2 else torch.randn(5, a.mouse_dim_in) * 0.1)
    if cfg.has_keyboard:
        keys = torch.cat([torch.zeros(1, a.keyboard_dim_in), torch.eye(a.keyboard_dim_in)])
        keyboard = held_actions(a.keyboard_dim_in, keys)
    return StreamInputs(torch.cat([mask, image], dim=1), visual, mouse, keyboard, first_block)


class NoiseSource:
    """Gaussian noise for (block, step), independent of call order: each draw has its own seed.

    Step 0 is the block's initial noise; step i >= 1 re-noises before denoising step i.
    Drawn in fp32 by a generator on ``device`` (values depend on the device type).
    """

    def __init__(self, seed: int = 0):
        if isinstance(seed, bool) or not isinstance(seed, numbers.Integral) or not 0 <= seed < 2 ** 64:
            raise WanTrtError(f"seed: expected an integer in [0, 2^64), got {seed!r} ({type(seed).__name__})")
        self.seed = int(seed)  # a NumPy integer too

    def __call__(self, block: int, step: int, shape: tuple[int, ...], device: str | torch.device = "cpu",
                 dtype: torch.dtype = torch.float32) -> torch.Tensor:
        gen = torch.Generator(device=device).manual_seed(draw_seed(self.seed, block, step))
        return torch.randn(shape, generator=gen, device=device).to(dtype)


_U64 = (1 << 64) - 1


def _splitmix64(x: int) -> int:
    z = (x + 0x9E3779B97F4A7C15) & _U64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _U64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _U64
    return z ^ (z >> 31)


def draw_seed(seed: int, block: int, step: int) -> int:
    """The generator seed of one draw: (seed, block, step) mixed by splitmix64 (as the C++ runtime does), 63 bits.
    Every bit depends on all three, so the CPU generator, which keeps the low 32 bits, sees no seed as another
    seed shifted by some blocks (a linear seed * 1000003 + block * 1009 + step did)."""
    h = _splitmix64(seed & _U64)
    h = _splitmix64(h ^ (block & _U64))
    return _splitmix64(h ^ (step & _U64)) >> 1
