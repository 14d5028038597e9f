"""One denoising pass in the static-cache form: spec-named tensors in, spec-named tensors out.

This is the function every graph flavour exports and every engine runs: no Python
state, no host syncs, no data-dependent shapes. Inputs arrive positionally in
``spec.input_names`` order (so torch.export / ONNX see a flat signature) and the
outputs leave in ``spec.output_names`` order.
"""
from __future__ import annotations

import torch
from torch import nn

from wan_trt.model.caches import StaticCaches
from wan_trt.model.rope import BlockRope
from wan_trt.model.transformer import CausalWanModel
from wan_trt.spec import (COND_CONCAT, FLOW, KEYBOARD_WINDOW, LATENTS, MOUSE_WINDOW, TIMESTEP, VALID_FRAMES,
                          VISUAL_CONTEXT, PassSpec)


class StaticPass(nn.Module):
    """Wraps a :class:`CausalWanModel` as ``forward(*inputs) -> tuple(outputs)`` per ``spec``."""

    def __init__(self, model: CausalWanModel, spec: PassSpec):
        super().__init__()
        self.model = model
        self.spec = spec
        self.input_names = spec.input_names
        self.output_names = spec.output_names

    def forward(self, *args: torch.Tensor) -> tuple[torch.Tensor, ...]:
        feeds = dict(zip(self.input_names, args))
        spec, model = self.spec, self.model
        caches = StaticCaches(
            prev={c.kind: {layer: tuple(feeds.get(name) for name in c.prev_names(layer)) for layer in c.layers}
                  for c in spec.caches},
            valid_frames=feeds.get(VALID_FRAMES),
            prev_frames=spec.config.prev_frames,
            units={c.kind: c.units for c in spec.caches},
        )
        rope = BlockRope.of({r.kind: (feeds[r.cos], feeds[r.sin]) for r in spec.rotaries})
        flow = model(feeds[LATENTS], feeds[TIMESTEP], feeds[COND_CONCAT],
                     model.encode_context(feeds[VISUAL_CONTEXT]), feeds.get(MOUSE_WINDOW),
                     feeds.get(KEYBOARD_WINDOW), rope, caches)
        outputs = {FLOW: flow}
        for c in spec.caches:  # each layer's K/V as computed (a copy only where a view is strided)
            for layer in c.layers:
                outputs.update(zip(c.cur_names(layer), (t.contiguous() for t in caches.current[c.kind][layer])))
        return tuple(outputs[name] for name in self.output_names)

    def run(self, feeds: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """Named call: checks the feeds against the spec, returns named outputs."""
        self.spec.check_feeds(feeds)
        return dict(zip(self.output_names, self(*(feeds[n] for n in self.input_names))))
