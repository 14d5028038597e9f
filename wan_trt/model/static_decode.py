"""One decoder call in static form: spec-named tensors in, spec-named tensors out (the function the
decoder's graphs export and its engines run; see :mod:`wan_trt.decoder_spec`)."""
from __future__ import annotations

import torch
from torch import nn

from wan_trt.decoder_spec import DecoderSpec
from wan_trt.model.vae import VideoDecoder
from wan_trt.spec import LATENTS


class StaticDecode(nn.Module):
    """Wraps a :class:`VideoDecoder` as ``forward(*inputs) -> tuple(outputs)`` per ``spec``."""

    def __init__(self, decoder: VideoDecoder, spec: DecoderSpec):
        super().__init__()
        self.decoder = decoder
        self.spec = spec
        self.input_names = spec.input_names
        self.output_names = spec.output_names

    def forward(self, *args: torch.Tensor) -> tuple[torch.Tensor, ...]:
        feeds = dict(zip(self.input_names, args))
        latents = feeds[LATENTS]
        if self.spec.first:  # a stream's start: every causal convolution starts from zeros
            history = [torch.zeros(self.spec.tensor(out).shape, dtype=latents.dtype, device=latents.device)
                       for _, out in self.spec.histories]
        else:
            history = [feeds[name] for name, _ in self.spec.histories]
        rgb, history = self.decoder(latents, history, first=self.spec.first)
        return (rgb, *history)
