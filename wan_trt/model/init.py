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
