"""The reference streaming pipeline with upstream semantics (CausalInferencePipeline.inference).

Per block of F latent frames starting at latent frame ``sf``:

    x = noise
    for i, t in enumerate(warped timesteps):           # 3 (universal) or 4 (templerun)
        flow = model(x, t, ...)                         # rolling caches overwrite this block's slot
        x0 = x - sigma(t) * flow
        x = renoise(x0, fresh noise, sigma(t_{i+1}))    # except after the last step
    output x0
    model(x0, t=0, ...)                                 # clean pass: leaves the clean K/V in the caches

Caches are upstream's rolling buffers (:class:`RollingCaches`); the action windows are
cut from the full raw history the way upstream's ``cond_current`` + ActionModule do.
This is the ground truth the static-cache runtime (engines/runtime/session.py) is tested against.

A stream may start at a later block N (``start_block``): RoPE and noise at their absolute
positions, empty caches, and every raw action frame before block N's first one reads as
that first frame (as the start padding does for block 0). Upstream always starts at 0.
"""
from __future__ import annotations

from typing import Iterator

import torch

from wan_trt.config import WanConfig
from wan_trt.model.caches import RollingCaches, RollingKV
from wan_trt.model.rope import BlockRope
from wan_trt.model.transformer import CausalWanModel
from wan_trt.scheduler import BlockSchedule, flow_to_x0, renoise
from wan_trt.stream import NoiseSource, StreamInputs, first_raw_frame


def upstream_windows(cfg: WanConfig, history: torch.Tensor | None, start_frame: int,
                     offset: int = 0) -> torch.Tensor | None:
    """Upstream's slicing: history up to the block, padded, re-sliced, grouped -> [B, F, 12, D].

    ``offset`` > 0: ``history`` starts at absolute raw frame ``offset`` and every earlier raw frame
    equals its first (a stream started later, :func:`history_from`); the same slicing is done on
    the tail only, so memory does not grow with the position.
    """
    if history is None:
        return None
    a, f = cfg.model.action_config, cfg.block_frames
    ratio, pad = a.vae_time_compression_ratio, a.window_frames
    cond_len = 1 + ratio * (start_frame + f - 1)  # cond_current
    cond = history[:, :cond_len - offset]
    n_feats = (cond_len - 1) // ratio + 1
    padded = torch.cat([cond[:, :1].expand(-1, pad, -1), cond], dim=1)  # upstream's padded[offset:]
    first = ratio * (n_feats - f - a.windows_size) + pad - offset
    if offset and first < 0:
        raise ValueError(f"windows of latent frame {start_frame} reach before raw frame {offset}")
    sliced = padded[:, first:]
    groups = [sliced[:, ratio * (i - a.windows_size) + pad:i * ratio + pad] for i in range(f)]
    return torch.stack(groups, dim=1)


def history_from(cfg: WanConfig, history: torch.Tensor | None, block: int) -> torch.Tensor | None:
    """Raw history [B, N, D] as a stream started at ``block`` sees it: earlier frames = its first frame."""
    first = first_raw_frame(cfg, block)
    if history is None or first == 0:
        return history
    seen = history.clone()
    seen[:, :first] = history[:, first:first + 1]
    return seen


def rolling_caches(model: CausalWanModel, batch: int = 1, start_frame: int = 0) -> RollingCaches:
    """Zeroed upstream caches: self [B, local*S, H, D], mouse [B*S, local, Hh, Dh], keyboard [B, local, Hh, Dh].

    ``start_frame`` > 0: the caches of a stream starting there, empty as if every earlier frame
    had been evicted.
    """
    cfg = model.cfg
    m, a = cfg.model, cfg.model.action_config
    local, s = m.local_attn_size, cfg.tokens_per_frame
    dev, dt = model.patch_embedding.weight.device, model.dtype
    caches = RollingCaches(
        self_kv=[RollingKV(batch, local, s, m.num_heads, cfg.head_dim, dt, dev) for _ in range(m.num_layers)],
        mouse_kv={layer: RollingKV(batch * s, local, 1, a.heads_num, a.head_dim, dt, dev)
                  for layer in cfg.action_layers} if cfg.has_mouse else {},
        keyboard_kv={layer: RollingKV(batch, local, 1, a.heads_num, a.head_dim, dt, dev)
                     for layer in cfg.action_layers} if cfg.has_keyboard else {},
    )
    for kv in (*caches.self_kv, *caches.mouse_kv.values(), *caches.keyboard_kv.values()):
        kv.global_end = start_frame * kv.units  # tokens written so far (none held: local_end stays 0)
    return caches


class ReferencePipeline:
    """Streams blocks through a :class:`CausalWanModel` exactly as upstream does."""

    def __init__(self, model: CausalWanModel):
        self.model = model
        self.cfg = model.cfg
        self.schedule = BlockSchedule.from_config(self.cfg)

    @torch.no_grad()
    def run(self, inputs: StreamInputs, blocks: int, noise: NoiseSource, *,
            start_block: int = 0) -> Iterator[torch.Tensor]:
        """Yield the denoised latents [B, 16, F, H, W] (model dtype) of blocks ``start_block`` on.

        ``inputs`` hold the stream from block 0 or from ``start_block`` (only blocks from ``start_block``
        on are read).
        """
        model, cfg, sched = self.model, self.cfg, self.schedule
        dev, dt = model.patch_embedding.weight.device, model.dtype
        f = cfg.block_frames
        caches = rolling_caches(model, start_frame=start_block * f)
        context_kv = model.encode_context(inputs.visual_context.to(dev))  # upstream crossattn_cache
        shape = (1, cfg.model.out_dim, f, cfg.inference.latent_height, cfg.inference.latent_width)
        if inputs.first_block not in (0, start_block):
            raise ValueError(f"inputs from block {inputs.first_block} cannot start a stream at block {start_block}")
        offset = inputs.first_raw_frame(cfg)
        mouse_history, keyboard_history = (h if offset else history_from(cfg, h, start_block)
                                           for h in (inputs.mouse, inputs.keyboard))
        for block in range(start_block, start_block + blocks):
            start = block * f
            caches.start_frame = start
            cond = inputs.block_cond(cfg, block).to(dev, dt)
            mouse = upstream_windows(cfg, mouse_history, start, offset)
            keyboard = upstream_windows(cfg, keyboard_history, start, offset)
            mouse, keyboard = (None if w is None else w.to(dev, dt) for w in (mouse, keyboard))
            rope = BlockRope.at(cfg, start, dev)

            def call(x: torch.Tensor, t: float) -> torch.Tensor:
                timestep = torch.full((1, f), t, dtype=torch.float32, device=dev)
                return model(x, timestep, cond, context_kv, mouse, keyboard, rope, caches)

            x = noise(block, 0, shape, dev, dt)
            for i, (t, sigma) in enumerate(zip(sched.timesteps, sched.sigmas)):
                x0 = flow_to_x0(call(x, t), x, sigma)
                if i + 1 < len(sched.timesteps):
                    x = renoise(x0, noise(block, i + 1, shape, dev, dt), sched.sigmas[i + 1])
            yield x0
            call(x0, sched.clean_timestep)
