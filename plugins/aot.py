"""Ahead-of-time compilation of the fused kernels to PTX, for the TensorRT plugins' ``aot_impl``
(usable without TensorRT and, with ``arch``, without a GPU).

All shapes are static, so every size and stride is known when the PTX is built; they reach the
kernel as int32 extra arguments, in the kernels' order (inputs, scalars, outputs). Each op's
``<name>_plan`` (in its module) builds one :class:`Plan` with :func:`compile_ptx`.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, NamedTuple

import torch
import triton
from triton.backends.compiler import GPUTarget

from wan_trt.errors import WanTrtError
from wan_trt.plugins.launch import Launch

TRITON_TYPES = {torch.bfloat16: "bf16", torch.float16: "fp16", torch.float32: "fp32", torch.int32: "i32"}


class TensorArg(NamedTuple):
    """A plan's view of one tensor input: a contiguous tensor of this shape and dtype."""
    shape: tuple[int, ...]
    dtype: torch.dtype


@dataclass
class Compiled:
    name: str
    ptx: str
    shared: int
    num_warps: int


class Plan(NamedTuple):
    """What TensorRT launches: the compiled kernel, its grid and its int32 scalars in kernel order."""
    compiled: Compiled
    grid: tuple[int, ...]
    scalars: list[int]


def compile_ptx(kernel, pointers: dict[str, torch.dtype], scalars: dict[str, int], outputs: dict[str, torch.dtype],
                constexprs: dict[str, Any], launch: Launch, arch: int | None = None) -> Compiled:
    """Compile a Triton kernel to PTX with the given argument types and ``launch`` settings (the
    launcher's), for the current GPU or for compute capability ``arch`` (e.g. 90; no GPU needed then).
    The dicts must list the kernel's parameters in order (TensorRT passes the scalars by position);
    the launch's block sizes join ``constexprs``. Like Triton's launcher, it tells the compiler which
    arguments are multiples of 16, without which loads are neither vectorized nor pipelined through
    cp.async: the scalars whose value is, and every pointer. The launcher checks pointers on each call;
    an engine cannot, so this assumes TensorRT hands plugins 16-byte-aligned buffers (its allocations
    are 256-byte aligned in practice; not verifiable here)."""
    fn = kernel.fn if isinstance(kernel, triton.runtime.Autotuner) else kernel  # the JITFunction
    order = {name: i for i, name in enumerate(fn.arg_names)}
    constexprs = dict(sorted({**constexprs, **launch.blocks}.items(), key=lambda kv: order.get(kv[0], len(order))))
    signature = {name: f"*{TRITON_TYPES[dt]}" for name, dt in pointers.items()}
    signature.update({name: "i32" for name in scalars})
    signature.update({name: f"*{TRITON_TYPES[dt]}" for name, dt in outputs.items()})
    signature.update({name: "constexpr" for name in constexprs})
    aligned = set(pointers) | set(outputs) | {name for name, value in scalars.items() if value % 16 == 0}
    attrs = {(i,): [["tt.divisibility", 16]] for i, name in enumerate(signature) if name in aligned}
    if list(signature) != fn.arg_names:
        raise WanTrtError(f"compile_ptx: arguments {list(signature)} are not {fn.__name__}'s parameters "
                          f"{fn.arg_names} in order")
    target = None if arch is None else GPUTarget("cuda", arch, 32)
    compiled = triton.compile(triton.compiler.ASTSource(fn=fn, signature=signature, constexprs=constexprs,
                                                        attrs=attrs),
                              target=target, options={"num_warps": launch.num_warps, "num_stages": launch.num_stages})
    return Compiled(compiled.metadata.name, compiled.asm["ptx"], compiled.metadata.shared, launch.num_warps)

