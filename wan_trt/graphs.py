"""The graph-kind registry: every kind of graph wan-trt exports, builds and checks, registered once.

A kind ties together its spec class (the I/O contract, recorded in each export's manifest), how its
PyTorch module is built (checkpoint or seeded random weights), the static wrapper that every graph
flavour exports and every engine runs, and its sample inputs. Exports, engine builds, runners and
checks look the kind up from a spec (:func:`graph_kind`) instead of assuming the DiT pass.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import torch
from torch import nn

from wan_trt.decoder_spec import DecoderSpec, TinyDecoderSpec
from wan_trt.errors import WanTrtError
from wan_trt.model import build_decoder, build_model, build_tiny_decoder
from wan_trt.model.static_decode import StaticDecode
from wan_trt.model.static_pass import StaticPass
from wan_trt.spec import LATENTS, GraphSpec, PassSpec


@dataclass(frozen=True)
class GraphKind:
    """One registered graph kind.

    Attributes:
        name: recorded in spec dicts (``graph``; absent means ``pass``) and given to ``--graph``.
        spec: its spec class.
        build: ``build(cfg, dtype, device, weights, seed)`` -> the PyTorch module (eval, no grad).
        static: ``static(module, spec)`` -> the module as ``forward(*inputs) -> outputs`` in spec order.
        sample_inputs: ``sample_inputs(module, spec, seed)`` -> plausible feeds of one call.
        prepare: ``prepare(module, ops, precision)`` -> the module as graphs hold it (fp32 islands, the DiT's
            context projections, keyboard projections and mouse window shares computed for all layers at
            once, fused kernels for ``ops == 'plugins'``, FP8 GEMMs for 'fp8');
            the PyTorch references stay unprepared.
        weights_flag: the flag that names its checkpoint.
        channels_last_convolutions: its prepared module's 3-D convolutions run channels-last (their
            weights are): a CUDA AOTInductor build keeps them so
            (``inductor_fixes.channels_last_3d_convolutions``).
        fused_ops: ``prepare`` has a form with fused ops (``ops == 'plugins'``); a build asking for it of a kind
            without is refused.
    """

    name: str
    spec: type[GraphSpec]
    build: Callable[..., nn.Module]
    static: Callable[[nn.Module, Any], nn.Module]
    sample_inputs: Callable[[nn.Module, Any, int], dict[str, torch.Tensor]]
    prepare: Callable[[nn.Module, str], nn.Module]
    weights_flag: str
    channels_last_convolutions: bool = False
    fused_ops: bool = True


def _prepare_pass(model: nn.Module, ops: str, precision: str) -> nn.Module:
    model.sinusoid_dtype = torch.float32  # graphs keep fp32 islands; TensorRT has no float64
    model.fuse_context_projections().fuse_keyboard_projections().split_mouse_inputs()
    if ops == "plugins":
        model.use_plugins().stack_modulations()
    if precision == "fp8":
        model.use_fp8()
    return model


def _prepare_decoder(decoder: nn.Module, ops: str, precision: str) -> nn.Module:
    return decoder.use_engine_form(fused=ops == "plugins")


def _prepare_tiny_decoder(decoder: nn.Module, ops: str, precision: str) -> nn.Module:
    return decoder.use_engine_form()  # no fused ops of its own (fused_ops=False: builds refuse --ops plugins)


def _pass_samples(model: nn.Module, spec: PassSpec, seed: int) -> dict[str, torch.Tensor]:
    return spec.sample_inputs(seed)


@torch.no_grad()
def _decoder_samples(decoder: nn.Module, spec: DecoderSpec, seed: int) -> dict[str, torch.Tensor]:
    """Random latents; for the steady call, the histories a first call on other random latents leaves."""
    gen = torch.Generator().manual_seed(seed)
    device = next(decoder.parameters()).device
    shape = spec.tensor(LATENTS).shape
    feeds = {LATENTS: torch.randn(shape, generator=gen).to(spec.dtype)}
    if not spec.first:
        start = type(spec).from_config(spec.config, spec.precision, "first")
        outputs = StaticDecode(decoder, start)(torch.randn(shape, generator=gen).to(device, spec.dtype))
        nexts = dict(zip(start.output_names, outputs))
        feeds.update({name: nexts[out].cpu() for name, out in spec.histories})
    return feeds


GRAPH_KINDS: dict[str, GraphKind] = {k.name: k for k in (
    GraphKind("pass", PassSpec, build_model, StaticPass, _pass_samples, _prepare_pass, "--weights"),
    GraphKind("decoder", DecoderSpec, build_decoder, StaticDecode, _decoder_samples, _prepare_decoder,
              "--vae-weights", channels_last_convolutions=True),
    GraphKind("tiny-decoder", TinyDecoderSpec, build_tiny_decoder, StaticDecode, _decoder_samples,
              _prepare_tiny_decoder, "--vae-weights", fused_ops=False),
)}


def graph_kind(spec: GraphSpec) -> GraphKind:
    """The registered kind of ``spec``."""
    return GRAPH_KINDS[spec.KIND]


def spec_from_dict(data: dict[str, Any]) -> GraphSpec:
    """The spec a manifest records (its ``graph`` names the kind; none: a DiT pass), checked."""
    name = data.get("graph", "pass")
    if name not in GRAPH_KINDS or name == "pass" and "graph" in data:
        raise WanTrtError(f"manifest graph {name!r}: this wan-trt knows {', '.join(GRAPH_KINDS)}; re-export")
    return GRAPH_KINDS[name].spec.from_dict(data)
