"""The I/O contract of the video decoders' graphs: one :class:`DecoderSpec` per graph (the tiny decoder's:
:class:`TinyDecoderSpec`, the same contract with its own histories).

A stream's latents are decoded block by block (F = frames per block, h x w latents, 8h x 8w
pixels). The first block of a stream decodes differently (upstream's first-frame rule: its first
latent frame yields one video frame, not four), so the decoder has two graphs, one per call:

    first    latents [1, 16, F, h, w]                       -> rgb [1, 3, 1 + 4(F-1), 8h, 8w], history_NN_next
    steady   latents [1, 16, F, h, w], history_00 .. _31    -> rgb [1, 3, 4F, 8h, 8w],         history_NN_next

``rgb`` is fp32 in [-1, 1] (upstream clamps there); latents and histories are in the graph's
precision. ``history_NN`` [1, 2, h', w', C] holds the last two input frames of the NN-th causal
3-frame convolution in call order (its doc names the convolution's module path), channels last: the
layout the engines' convolutions run in, so carrying a history is a plain copy. The first graph
starts from empty histories (a stream's start) and so has no history inputs; after any call,
``history_NN <- history_NN_next`` feeds the next steady call. The unit is one block (a call per
block): on an H100 one 3-frame call ran faster than three 1-frame calls (141 vs 157 ms eager bf16).

The tiny decoder's graphs (:class:`TinyDecoderSpec`, kind ``tiny-decoder``) yield the same frames per call
and carry 9 histories: ``history_NN`` [1, h', w', C] is the last input frame of its NN-th memory block.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

import torch

from wan_trt.config import WanConfig
from wan_trt.errors import WanTrtError
from wan_trt.model import decoder_config
from wan_trt.model.taehv import TinyDecoder
from wan_trt.model.vae import VideoDecoder
from wan_trt.precisions import ENGINE_ONLY
from wan_trt.spec import DTYPE_NAMES, LATENTS, SPEC_VERSION, GraphSpec, TensorSpec, precision_dtype

CALLS = ("first", "steady")
RGB = "rgb"
PIXELS_PER_LATENT = 8  # the decoder's spatial upsampling


def history_io_shape(shape: tuple[int, ...]) -> tuple[int, ...]:
    """A history's shape as graph I/O: the module's [B, C, ...] channels last, [B, ..., C]."""
    return (shape[0], *shape[2:], shape[1])


def history_name(index: int, next_value: bool = False) -> str:
    return f"history_{index:02d}" + ("_next" if next_value else "")


@dataclass(frozen=True)
class DecoderSpec(GraphSpec):
    """One decoder call (``call``: 'first' or 'steady') of a config in a precision."""

    call: str
    histories: tuple[tuple[str, str], ...]  # (input, output) name pairs in call order; inputs only when steady

    KIND = "decoder"
    HISTORY = "last 2 input frames"  # what a history holds

    @staticmethod
    def module(cfg: WanConfig) -> torch.nn.Module:
        """The decoder's module for ``cfg``, unallocated (build it under the meta device)."""
        return VideoDecoder(decoder_config(cfg))

    @classmethod
    def from_config(cls, cfg: WanConfig, precision: str = "bf16", call: str = "steady") -> "DecoderSpec":
        if call not in CALLS:
            raise WanTrtError(f"decoder call {call!r}: expected one of {', '.join(CALLS)}")
        if precision in ENGINE_ONLY:
            raise WanTrtError(f"--precision {precision}: the video decoder has no {precision} graph; export it with "
                              "--precision bf16 (the latents of an fp8 DiT engine are bf16)")
        dt = DTYPE_NAMES[precision_dtype(precision)]
        f, h, w = cfg.block_frames, cfg.inference.latent_height, cfg.inference.latent_width
        with torch.device("meta"):  # the layout only: no weights allocated
            module = cls.module(cfg)
        layout = module.history_layout(1, h, w)
        frames = module.video_frames(f, first=call == "first")
        p = PIXELS_PER_LATENT
        inputs = [TensorSpec(LATENTS, (1, cfg.model.out_dim, f, h, w), dt, "the block's denoised latents (normalised)")]
        outputs = [TensorSpec(RGB, (1, 3, frames, p * h, p * w), "float32", "the block's video frames in [-1, 1]")]
        pairs = []
        for i, (path, shape) in enumerate(layout):
            pairs.append((history_name(i), history_name(i, True)))
            shape = history_io_shape(shape)
            if call == "steady":
                inputs.append(TensorSpec(history_name(i), shape, dt, f"{cls.HISTORY} of {path}, channels last"))
            outputs.append(TensorSpec(history_name(i, True), shape, dt,
                                      f"{path}'s history after this call, channels last"))
        return cls(cfg, precision, tuple(inputs), tuple(outputs), call, tuple(pairs))

    @classmethod
    def variant(cls, data: dict[str, Any]) -> dict[str, Any]:
        return {"call": data["call"]}

    @property
    def first(self) -> bool:
        return self.call == "first"

    @property
    def video_frames(self) -> int:
        return self.tensor(RGB).shape[2]

    def to_dict(self) -> dict[str, Any]:
        return {
            "spec_version": SPEC_VERSION,
            "graph": self.KIND,
            "call": self.call,
            "precision": self.precision,
            "config": self.config.to_dict(),
            "inputs": [dataclasses.asdict(t) for t in self.inputs],
            "outputs": [dataclasses.asdict(t) for t in self.outputs],
            "histories": [list(p) for p in self.histories],
        }


@dataclass(frozen=True)
class TinyDecoderSpec(DecoderSpec):
    """One call of the tiny decoder (:mod:`wan_trt.model.taehv`): the same contract, its histories the last
    input frame of each of its 9 memory blocks, ``[1, h', w', C]``."""

    KIND = "tiny-decoder"
    HISTORY = "last input frame"

    @staticmethod
    def module(cfg: WanConfig) -> torch.nn.Module:
        return TinyDecoder(cfg.model.out_dim)
