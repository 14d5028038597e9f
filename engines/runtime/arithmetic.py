"""fp32 computed as fp32: the setting every fp32 computation of wan-trt runs under on a GPU.

PyTorch lets cuDNN's fp32 convolutions round their operands to TF32 (10 bits of mantissa, as fp16's) by
default, and a user may have let the matmuls do so too (``torch.set_float32_matmul_precision("high")``).
An fp32 graph run so is as far from fp32 as an fp16 one: the decoder's convolutions, the DiT's patch
embedding. The checks compute their fp32 references this way, and so does every runner of an fp32 graph
(:meth:`Runner.arithmetic`), in a check, a stream or a bench alike: an engine is timed and streamed with the
arithmetic it was judged with.
"""
from __future__ import annotations

import contextlib
from typing import ContextManager, Iterator

import torch


@contextlib.contextmanager
def fp32_as_fp32() -> Iterator[None]:
    """fp32 computed as fp32 on CUDA for the block (and the settings as before after it). Set through the flags
    PyTorch keeps consistent itself (``allow_tf32``, the matmul precision's own API): setting the per-operator
    precisions apart made its own reading of them (Inductor's, torch.export's) raise. Usable as a decorator (a new
    context each call)."""
    convolutions, matmuls = torch.backends.cudnn.allow_tf32, torch.get_float32_matmul_precision()
    torch.backends.cudnn.allow_tf32 = False
    torch.set_float32_matmul_precision("highest")  # the matmul setting's own API, as a user sets it ("high": TF32)
    try:
        yield
    finally:
        torch.backends.cudnn.allow_tf32 = convolutions
        torch.set_float32_matmul_precision(matmuls)


def computed_as(dtype: torch.dtype) -> ContextManager[None]:
    """The setting a graph of ``dtype`` runs under: :func:`fp32_as_fp32` for fp32, none for the others (their
    convolutions and matmuls take no TF32 path)."""
    return fp32_as_fp32() if dtype == torch.float32 else contextlib.nullcontext()
