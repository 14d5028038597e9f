"""The PyTorch reference CausalWanModel and how to build it."""
from __future__ import annotations

from pathlib import Path
from typing import Callable

import torch
from torch import nn

from wan_trt.config import WanConfig, validate
from wan_trt.sizes import require_room_for
from wan_trt.model.checkpoint import load_checkpoint, load_tiny_decoder, load_vae_decoder
from wan_trt.model.init import random_init
from wan_trt.model.rope import RopeTables
from wan_trt.model.taehv import TinyDecoder
from wan_trt.model.transformer import CausalWanModel
from wan_trt.model.vae import DecoderConfig, VideoDecoder, latent_statistics


def build_model(cfg: WanConfig, dtype: torch.dtype = torch.float32, device: str | torch.device = "cpu",
                weights: str | Path | None = None, seed: int = 0) -> CausalWanModel:
    """The model in eval mode on ``device``/``dtype``: loaded from ``weights`` or seeded random.

    Raises:
        WanTrtError: ``cfg`` is invalid or too large to allocate (checked before any allocation),
            or the checkpoint is unreadable, does not match ``cfg`` or holds NaN/Inf.
    """
    validate(cfg, f"config '{cfg.name}'")

    with torch.device("meta"):
        model = CausalWanModel(cfg)
    if weights is not None:
        load_checkpoint(model, weights, dtype=dtype, device=device)
        model.rope = RopeTables(cfg).to(device)
        model.make_unit_gates(device, dtype)
    elif torch.device(device).type == "meta":  # shapes only (counting FLOPs): nothing drawn
        model.rope = RopeTables(cfg).to("meta")
        model = model.to(dtype=dtype)
    else:
        require_room_for(model, f"the model of config '{cfg.name}'", "fix dim, ffn_dim or num_layers in the config")
        model = random_init(model.to_empty(device="cpu"), seed)  # no default init: every value is drawn
        model.rope = RopeTables(cfg)
        model.make_unit_gates("cpu", torch.float32)
        model = model.to(device=device, dtype=dtype)
    return model.eval().requires_grad_(False)


def decoder_config(cfg: WanConfig) -> DecoderConfig:
    """The decoder of ``cfg``: Wan2.1's VAE decoder at ``inference.vae_dim`` over the DiT's latent channels."""
    return DecoderConfig(dim=cfg.inference.vae_dim, z_dim=cfg.model.out_dim)


def build_decoder(cfg: WanConfig, dtype: torch.dtype = torch.float32, device: str | torch.device = "cpu",
                  weights: str | Path | None = None, seed: int = 0) -> VideoDecoder:
    """The video decoder of ``cfg`` (Wan2.1's VAE decoder at ``inference.vae_dim``) in eval mode: the
    decoder part of a VAE checkpoint, or seeded random weights (their frames are noise)."""
    cfg = decoder_config(cfg)
    with torch.device("meta"):
        decoder = VideoDecoder(cfg)
    if weights is None:
        require_room_for(decoder, f"the video decoder of width {cfg.dim}", "fix inference.vae_dim in the config "
                         "(Wan2.1's VAE: 96)")
    decoder = _with_weights(decoder, load_vae_decoder, weights, dtype, device, seed)
    decoder.mean, decoder.std = (t.to(device=device, dtype=dtype) for t in latent_statistics(cfg))
    return decoder


def build_tiny_decoder(cfg: WanConfig, dtype: torch.dtype = torch.float32, device: str | torch.device = "cpu",
                       weights: str | Path | None = None, seed: int = 0) -> TinyDecoder:
    """The tiny video decoder of ``cfg`` (TAEHV's, over the DiT's latent channels) in eval mode: the decoder
    part of a ``taew2_1.pth`` checkpoint, or seeded random weights (their frames are noise)."""
    with torch.device("meta"):
        decoder = TinyDecoder(cfg.model.out_dim)
    return _with_weights(decoder, load_tiny_decoder, weights, dtype, device, seed)


def _with_weights(decoder: nn.Module, load: Callable[..., nn.Module], weights: str | Path | None, dtype: torch.dtype,
                  device: str | torch.device, seed: int) -> nn.Module:
    """``decoder`` (made on the meta device) given its weights in eval mode: ``load``-ed from the checkpoint
    ``weights``, or seeded random."""
    if weights is not None:
        load(decoder, weights, dtype=dtype, device=device)
    else:
        decoder = random_init(decoder.to_empty(device="cpu"), seed).to(device=device, dtype=dtype)
    return decoder.eval().requires_grad_(False)


def count_parameters(cfg: WanConfig) -> int:
    """Parameters of the model for ``cfg`` (built on the meta device, no memory)."""
    with torch.device("meta"):
        model = CausalWanModel(cfg)
    return sum(p.numel() for p in model.parameters())


__all__ = ["CausalWanModel", "TinyDecoder", "VideoDecoder", "build_decoder", "build_model", "build_tiny_decoder",
           "decoder_config", "count_parameters"]
