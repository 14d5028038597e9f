"""One decoder call in static form: spec-named tensors in, spec-named tensors out (the function the
decoder's graphs export and its engines run; see :mod:`wan_trt.decoder_spec`)."""
from __future__ import annotations

import torch
from torch import nn

from wan_trt.decoder_spec import HISTORY_IO_ORDER, DecoderSpec
from wan_trt.model.vae import VideoDecoder
from wan_trt.spec import LATENTS

TO_MODULE = tuple(HISTORY_IO_ORDER.index(d) for d in range(5))  # a history as graph I/O -> as the module takes it


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
            io = [torch.zeros(self.spec.tensor(out).shape, dtype=latents.dtype, device=latents.device)
                  for _, out in self.spec.histories]
        else:
            io = [feeds[name] for name, _ in self.spec.histories]
        # [B, 2, h, w, C] -> [B, C, 2, h, w] views, channels-last in memory, and back (no copy in an engine)
        rgb, history = self.decoder(latents, [t.permute(TO_MODULE) for t in io], first=self.spec.first)
        return (rgb, *(t.permute(HISTORY_IO_ORDER).contiguous() for t in history))
