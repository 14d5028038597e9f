"""One decoder call in static form: spec-named tensors in, spec-named tensors out (the function the
decoders' graphs export and their engines run; see :mod:`wan_trt.decoder_spec`)."""
from __future__ import annotations

import torch
from torch import nn

from wan_trt.decoder_spec import DecoderSpec
from wan_trt.spec import LATENTS


class StaticDecode(nn.Module):
    """Wraps a decoder (:class:`~wan_trt.model.vae.VideoDecoder`, :class:`~wan_trt.model.taehv.TinyDecoder`)
    as ``forward(*inputs) -> tuple(outputs)`` per ``spec``."""

    def __init__(self, decoder: nn.Module, spec: DecoderSpec):
        super().__init__()
        self.decoder = decoder
        self.spec = spec
        self.input_names = spec.input_names
        self.output_names = spec.output_names

    def forward(self, *args: torch.Tensor) -> tuple[torch.Tensor, ...]:
        feeds = dict(zip(self.input_names, args))
        latents = feeds[LATENTS]
        if self.spec.first:  # a stream's start: every causal convolution starts from zeros
            io = [torch.zeros(self.spec.tensor(out).shape, dtype=latents.dtype, device=latents.device)
                  for _, out in self.spec.histories]
        else:
            io = [feeds[name] for name, _ in self.spec.histories]
        # [B, ..., C] -> [B, C, ...] views, channels-last in memory, and back (no copy in an engine)
        rgb, history = self.decoder(latents, [t.movedim(-1, 1) for t in io], first=self.spec.first)
        return (rgb, *(t.movedim(1, -1).contiguous() for t in history))
