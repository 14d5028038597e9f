"""Work-arounds for PyTorch Inductor bugs: the AOTInductor build (applied at build time) and the package
loader (:func:`make_libstdcxx_global`, applied before a package loads).

Each fix checks that the installed torch still has the bug and does nothing otherwise.

int array cache (torch 2.11; torch 2.13's source keys it on the bound object): the C++ wrapper
declares each size/stride array once (``int_array_N``) and caches the name under
``id(writeline)``. ``writeline`` is a bound method, a new object at every call, so its id is an
address that other, short-lived bound methods reuse:
a declaration written into one code buffer (e.g. the discarded first memory-planning pass) can
be handed out for another, and the C++ compile fails with "'int_array_300' was not declared in
this scope; did you mean 'int_array_400'" (seen on the H100 building the full universal package
with the fused kernels; its build log is in git history). The fix keys the
cache on the buffer the method is bound to, and keeps every such buffer alive for the wrapper's
lifetime so that no two buffers ever share an id (the graph is keyed by id only, as upstream
does: holding it would tie the weights it owns into a reference cycle).

3-D convolution layout (torch 2.11, CUDA; :func:`channels_last_3d_convolutions`): Inductor lays a
convolution's output out as its fake kernel says, and for a 3-D convolution whose input is a
buffer already fixed channels-last (as the decoder's fused norm ops write theirs) and whose weight is
channels-last too, that came out contiguous (NCDHW). The engine then copied every such input out of
channels-last, cuDNN converted NCHW <-> NHWC around its kernel, and the next op copied the output
back: the decoder with its fused norms decoded a block in 143 ms instead of 50 (H100). While a graph
whose convolutions run channels-last compiles, a 3-D convolution with a channels-last weight gets a
channels-last output (and so a channels-last input), the layout cuDNN computes in for such inputs.
"""
from __future__ import annotations

import ctypes
import functools
import inspect
from contextlib import contextmanager
from typing import Iterator

import torch

from wan_trt.log import logger
from wan_trt.model.vae import channels_last_3d_strides


def int_array_var_keyed_by_buffer(self, int_array: str, writeline, known_statically: bool = False, graph=None) -> str:
    """``CppWrapperCpu.codegen_int_array_var`` with a stable cache key (see the module text)."""
    owner = getattr(writeline, "__self__", writeline)
    owners = self.__dict__.setdefault("_wan_trt_writeline_owners", {})
    owners.setdefault(id(owner), owner)  # held: its id cannot be reused by another buffer
    cache = self.__dict__.setdefault("_wan_trt_int_array_vars", {})
    key = (int_array, id(owner), known_statically, id(graph) if graph is not None else None)
    if key not in cache:
        cache[key] = self._codegen_int_array_var_impl(int_array, writeline, known_statically)
    return cache[key]


def has_transient_int_array_key(method) -> bool:
    """Whether ``method`` (the installed codegen_int_array_var) caches on ``id(writeline)``."""
    try:
        source = inspect.getsource(method)
    except (OSError, TypeError):
        logger.warning("cannot read Inductor's source: the int-array cache work-around is not applied")
        return False
    return "id(writeline)" in source and "__self__" not in source


def apply_inductor_fixes() -> list[str]:
    """Install the fixes this torch needs; returns their names."""
    from torch._inductor.codegen.cpp_wrapper_cpu import CppWrapperCpu

    applied = []
    if CppWrapperCpu.codegen_int_array_var is not int_array_var_keyed_by_buffer and \
            has_transient_int_array_key(CppWrapperCpu.codegen_int_array_var):
        CppWrapperCpu.codegen_int_array_var = int_array_var_keyed_by_buffer
        applied.append("int_array_cache_key")
    if applied:
        logger.info("Inductor work-arounds applied: %s", ", ".join(applied))
    return applied


def _is_channels_last_3d(node) -> bool:
    """Whether an Inductor tensor node is a 5-D tensor laid out channels-last (static sizes only)."""
    try:
        size, stride = [int(s) for s in node.get_size()], [int(s) for s in node.get_stride()]
    except (AttributeError, NotImplementedError, TypeError):  # no fixed layout, or symbolic sizes
        return False
    return len(size) == 5 and stride == channels_last_3d_strides(size)


@contextmanager
def _patched(owner, name: str, replacement_for, missing: str) -> Iterator[bool]:
    """While inside, ``owner.<name>`` is ``replacement_for(original)`` and Inductor's FX graph cache is off (a
    cached graph would skip the lowering the patch changes); yields whether the patch is in place (False, and
    the warning ``missing``, where this torch has no such attribute)."""
    original = getattr(owner, name, None)
    if original is None:
        logger.warning(missing)
        yield False
        return
    setattr(owner, name, replacement_for(original))
    try:
        with torch._inductor.config.patch(fx_graph_cache=False):
            yield True
    finally:
        setattr(owner, name, original)


def channels_last_3d_convolutions():
    """While inside, 3-D convolutions with a channels-last weight get a channels-last output (see the
    module text); yields whether the fix is in place (False where this torch has no hook for it)."""
    from torch._inductor import ir
    from torch._inductor.kernel import conv

    def replacement_for(original):
        def conv_layout(x, weight, *args, **kwargs):
            layout = original(x, weight, *args, **kwargs)
            if len(layout.size) != 5 or not _is_channels_last_3d(weight):
                return layout
            return ir.FixedLayout(layout.device, layout.dtype, layout.size, channels_last_3d_strides(layout.size))
        return conv_layout

    return _patched(conv, "conv_layout", replacement_for, "this torch's Inductor has no conv_layout: the decoder's "
                    "3-D convolutions may run through layout copies (slower engine)")


def _readers(node) -> list:
    """The FX nodes that read ``node``'s value, looking through views of it (a layer's slice of a table)."""
    import operator

    aten = torch.ops.aten
    views = {aten.view.default, aten.reshape.default, aten._unsafe_view.default, aten.select.int, aten.slice.Tensor,
             aten.unsqueeze.default, aten.squeeze.dim, aten.expand.default, aten.permute.default, aten.transpose.int,
             aten.t.default, aten.alias.default, aten.unbind.int, aten.split.Tensor, aten.split_with_sizes.default,
             operator.getitem}
    readers = []
    for user in node.users:
        readers += _readers(user) if user.target in views else [user]
    return readers


def _reads_in_kernels(node) -> bool:
    """Whether an FX node's value (or views of it) is read by two or more nodes, one a user-defined Triton
    kernel."""
    from torch._higher_order_ops.triton_kernel_wrap import (triton_kernel_wrapper_functional,
                                                            triton_kernel_wrapper_mutation)
    kernels = (triton_kernel_wrapper_functional, triton_kernel_wrapper_mutation)
    readers = _readers(node)
    return len(readers) > 1 and any(reader.target in kernels for reader in readers)


def shared_kernel_inputs():
    """While inside, an elementwise value that fused ops' Triton kernels read is computed once (see the
    module text); yields whether the fix is in place (False where this torch has no hook for it)."""
    from torch._inductor import ir
    from torch._inductor.graph import GraphLowering

    def replacement_for(original):
        def run_node(self, n):
            result = original(self, n)
            if isinstance(result, ir.TensorBox) and _reads_in_kernels(n):
                result.realize()
            return result
        return run_node

    return _patched(GraphLowering, "run_node", replacement_for, "this torch's Inductor has no GraphLowering.run_node: "
                    "values several fused kernels read are computed once per kernel (slower engine)")


LIBSTDCXX = "libstdc++.so.6"


@functools.cache
def make_libstdcxx_global() -> bool:
    """Make libstdc++ part of the process's global symbol scope (once), before loading a package.

    Observed on an H100 machine (torch 2.11, Ubuntu g++ 13.3): the package's shared library had no
    NEEDED entry for libstdc++, and loading it in a Python process crashed (SIGSEGV in std::regex
    inside AOTInductorModel's constructor) for CPU and CUDA packages alike; with the system
    libstdc++ loaded RTLD_GLOBAL first they load and run (the diagnosis's files and script are in git
    history). Opened by its soname, so the copy torch already loaded is the one
    promoted (no second copy). C++ executables (wan_stream) link libstdc++ themselves.
    """
    try:
        ctypes.CDLL(LIBSTDCXX, mode=ctypes.RTLD_GLOBAL)
    except OSError as exc:
        logger.warning("could not make %s global (%s): AOTInductor packages may crash while loading "
                       "(see scripts/diagnose_aoti.py)", LIBSTDCXX, exc)
        return False
    logger.debug("%s made global for AOTInductor packages", LIBSTDCXX)
    return True
