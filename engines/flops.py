"""How much arithmetic one call of a graph is, and how close a measured time comes to the GPU's peak.

FLOPs are counted (a multiply-add = 2) by running the graph's static module on the meta device with
PyTorch's FLOP counter: shapes only, no weights drawn, no device needed. Attention counts as its two
batched GEMMs (the meta device runs its math form). The module is the model as upstream computes it,
not its engine form: where an engine form does less arithmetic for the same result (the decoder's x2
upsamplings as transposed convolutions), a row's TFLOP/s is the rate of the model's arithmetic. The peak
compared with is the H100's dense bf16 data-sheet rate (the H200 has the same), for every row
whatever its precision: an fp8 engine's fraction of it can pass 1.
"""
from __future__ import annotations

import functools
from typing import Any

import torch
from torch.utils.flop_counter import FlopCounterMode

from wan_trt.graphs import graph_kind
from wan_trt.spec import GraphSpec

H100_DENSE_BF16_TFLOPS = 989.4  # H100 SXM data sheet, dense (no sparsity)


@functools.lru_cache(maxsize=None)
def graph_flops(spec: GraphSpec) -> float:
    """FLOPs of one call of the graph ``spec`` describes (its static module as exported); counted once per spec
    (a frozen description: bench counts the decoder's for its own rows and for the end-to-end ones)."""
    kind = graph_kind(spec)
    with torch.device("meta"):
        static = kind.static(kind.build(spec.config, spec.dtype, "meta"), spec)
        feeds = [torch.empty(spec.tensor(n).shape, dtype=spec.tensor(n).torch_dtype) for n in spec.input_names]
        with FlopCounterMode(display=False) as counter:
            static(*feeds)
    return float(counter.get_total_flops())


def roofline_ms(flops: float) -> float:
    """Milliseconds ``flops`` take at the dense bf16 peak."""
    return 1e3 * flops / (H100_DENSE_BF16_TFLOPS * 1e12)


def throughput(flops: float, ms: float) -> dict[str, Any]:
    """The rate ``flops`` in ``ms`` milliseconds is (TFLOP/s) and its fraction of the dense bf16 peak."""
    tflops = flops / (ms * 1e-3) / 1e12
    return {"tflops": tflops, "dense_bf16_fraction": tflops / H100_DENSE_BF16_TFLOPS}
