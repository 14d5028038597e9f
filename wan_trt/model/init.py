"""Seeded random weights for tests, exports and benchmarks when no checkpoint is given.

Upstream ``init_weights`` zeroes the head and the action projections, so a fresh
model outputs exactly 0 and any comparison passes. Here every parameter is drawn
(seeded, on the CPU, so the weights are the same on every machine): xavier for
matrices, small non-zero biases, norm weights around 1, modulations as upstream.
"""
from __future__ import annotations

import torch
from torch import nn


@torch.no_grad()
def random_init(model: nn.Module, seed: int = 0) -> nn.Module:
    """Draw every parameter of ``model`` (on the CPU, fp32 or any float dtype) from a seeded generator."""
    gen = torch.Generator().manual_seed(seed)
    for name, param in model.named_parameters():
        leaf = name.rsplit(".", 1)[-1]
        target = param if param.dtype == torch.float32 else torch.empty(param.shape)
        if name.endswith("modulation"):
            target.normal_(0.0, param.shape[-1] ** -0.5, generator=gen)
        elif leaf == "bias":
            target.normal_(0.0, 0.02, generator=gen)
        elif param.ndim == 1 or leaf == "gamma":  # norm weights (the video decoder's are [C, 1, 1(, 1)])
            target.normal_(1.0, 0.1, generator=gen)
        elif name.startswith("time_embedding"):
            target.normal_(0.0, 0.02, generator=gen)
        else:  # xavier uniform over (fan_out, fan_in) of the flattened matrix
            fan_out, fan_in = param.shape[0], param[0].numel()
            bound = (6.0 / (fan_in + fan_out)) ** 0.5
            target.uniform_(-bound, bound, generator=gen)
        if target is not param:
            param.copy_(target)
    return model


STRESS_FACTORS = (30.0, 50.0, 80.0, 100.0)
# adaLN chunks of the modulation / time projection (shift_a, scale_a, gate_a, shift_f, scale_f, gate_f)
# -> the linears of each layer that read the modulated input
_MODULATED = {(0, 1): ("self_attn.q", "self_attn.k", "self_attn.v"), (3, 4): ("ffn.0",)}


@torch.no_grad()
def stress_weights(model: nn.Module, factors: tuple[float, ...] = STRESS_FACTORS, seed: int = 1) -> nn.Module:
    """Give a few channels of every layer's self-attention and FFN inputs ``factors`` times their size
    (the same channels in every layer, as trained transformers' outlier channels are) without changing
    what the model computes: the weights a quantization scheme must survive. In place; returns model.

    Those inputs are LN(x) * (1 + scale) + shift with scale, shift = modulation + e0 (e0 from the shared
    time projection). For channel c and factor d: e0's scale and shift rows of c times d, each layer's
    modulation 1 + scale -> d (1 + scale) and shift -> d shift, and the reading linears' column c / d.
    """
    dim = model.blocks[0].modulation.shape[-1]
    channels = torch.randperm(dim, generator=torch.Generator().manual_seed(seed))[:len(factors)]
    projection = model.time_projection[1]
    for c, d in zip(channels.tolist(), factors):
        for (shift, scale), readers in _MODULATED.items():
            for chunk in (shift, scale):
                projection.weight[chunk * dim + c] *= d
                projection.bias[chunk * dim + c] *= d
            for block in model.blocks:
                block.modulation[0, shift, c] *= d
                block.modulation[0, scale, c] = d * (1 + block.modulation[0, scale, c]) - 1
                for path in readers:
                    block.get_submodule(path).weight[:, c] /= d
    return model
