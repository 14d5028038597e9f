"""The fused ops, each declared once: name, signature, outputs, TensorRT tactics. Every adapter loops
over :data:`FUSED_OPS` with no per-op code: the PyTorch custom ops (``plugins/ops.py``), the ONNX
schemas and export (``export/plugin_ops.py``), the ONNX Runtime ops (``plugins/onnxruntime_ops.py``),
the TensorRT plugins (``plugins/tensorrt_plugins.py``) and the profiler's kernel names.

One name per op (Liger-Kernel's habit). For op ``name`` in module ``plugins/<module>.py``:

    reference_<name>(*inputs, *attrs)                 pure PyTorch, the numbers to match
    <name>(*inputs, *attrs)                           the launcher (checks its limits, runs the kernel)
    _<name>_kernel                                    the Triton kernel
    <name>_plan(*inputs, *attrs, tactic=, arch=)      its TensorRT ahead-of-time plan (inputs as
                                                      plugins.aot.TensorArg: shape and dtype)

``torch.ops.wan_trt.<name>`` is the custom op; ``wan_trt::<OpType>`` (``name`` in CamelCase) the ONNX
node and TensorRT plugin. tests/plugins/test_registry.py checks that each entry has all of them.
This module is plain Python: names and signatures are known without Triton.
"""
from __future__ import annotations

import importlib
import inspect
from dataclasses import dataclass
from types import ModuleType
from typing import Any, Callable, Sequence

from wan_trt.errors import WanTrtError
from wan_trt.plugins.launch import GPU_TILINGS, Tiling

NAMESPACE = "wan_trt"  # torch.ops namespace, ONNX domain and TensorRT plugin namespace
# ONNX type constraints of the inputs: T activations, U a second float type (the modulation when
# the residual stream is fp32), I int32, F fp32.
TYPE_CONSTRAINTS = {"T": ("tensor(float)", "tensor(float16)", "tensor(bfloat16)"),
                    "U": ("tensor(float)", "tensor(float16)", "tensor(bfloat16)"),
                    "I": ("tensor(int32)",), "F": ("tensor(float)",)}


@dataclass(frozen=True)
class Input:
    name: str
    type: str = "T"  # a key of TYPE_CONSTRAINTS


@dataclass(frozen=True)
class Output:
    name: str
    like: str  # the input whose shape (and, unless dtype_of is set, dtype) it has
    dtype_of: str | None = None  # the input whose dtype it has
    grown: tuple[str, int] | None = None  # (input, dim): that dim is like's plus the input's (a join)


@dataclass(frozen=True)
class Attr:
    name: str
    type: type  # int or float


@dataclass(frozen=True)
class FusedOp:
    """One fused op: its signature (tensor inputs, then attributes) and where its code lives."""
    name: str  # snake_case: torch.ops.wan_trt.<name>, reference_<name>, _<name>_kernel, ...
    module: str  # wan_trt.plugins.<module> holds the reference, launcher, kernel and plan
    inputs: tuple[Input, ...]
    outputs: tuple[Output, ...]
    attrs: tuple[Attr, ...]
    tactics: tuple[Tiling, ...] = ()  # TensorRT tactics (the plan's ``tactic`` indexes them); () = one plan
    channels_last: bool = False  # 5-D tensors stored channels-last (TensorRT's DHWC format), others linear

    @property
    def op_type(self) -> str:
        """The ONNX node type and TensorRT plugin name: ``add_adaln`` -> ``AddAdaln``."""
        return "".join(part.capitalize() for part in self.name.split("_"))

    @property
    def kernel_name(self) -> str:
        return f"_{self.name}_kernel"

    def input_type(self, name: str) -> str:
        return next(i.type for i in self.inputs if i.name == name)

    def output_type(self, out: Output) -> str:
        """An output's type constraint: that of the input it takes its dtype from."""
        return self.input_type(out.dtype_of or out.like)

    def signature(self, tensor: Any = inspect.Parameter.empty, *, returns: bool = False,
                  extra: Sequence[inspect.Parameter] = ()) -> inspect.Signature:
        """The op's Python signature: the inputs (annotated ``tensor``), the attributes (int / float),
        then ``extra`` parameters; with ``returns``, one ``tensor`` per output as return annotation."""
        kind = inspect.Parameter.POSITIONAL_OR_KEYWORD
        params = [inspect.Parameter(i.name, kind, annotation=tensor) for i in self.inputs]
        params += [inspect.Parameter(a.name, kind, annotation=a.type) for a in self.attrs]
        result = inspect.Signature.empty
        if returns:
            result = tensor if len(self.outputs) == 1 else tuple[(tensor,) * len(self.outputs)]
        return inspect.Signature(params + list(extra), return_annotation=result)

    def implementation(self) -> ModuleType:
        """The op's module (imported here, not at the top: it needs Triton, an optional dependency; where Triton is
        not installed, a WanTrtError says so)."""
        try:
            return importlib.import_module(f"wan_trt.plugins.{self.module}")
        except ModuleNotFoundError as exc:
            if exc.name != "triton" and not str(exc.name).startswith("triton."):
                raise
            raise WanTrtError("--ops plugins: the fused ops are Triton kernels, and Triton is not installed here: "
                              "pip install triton (CUDA builds of torch bring it), or use --ops native") from None

    @property
    def reference(self) -> Callable:
        return getattr(self.implementation(), f"reference_{self.name}")

    @property
    def launch(self) -> Callable:
        return getattr(self.implementation(), self.name)

    @property
    def kernel(self) -> Callable:
        return getattr(self.implementation(), self.kernel_name)

    @property
    def plan(self) -> Callable:
        return getattr(self.implementation(), f"{self.name}_plan")


# The residual stream x is T; the modulation a, c (and the branch output y, the gate g) are U.
_NORM_ATTRS = (Attr("frames", int), Attr("eps", float))
_JOINED = Output("joined", like="history", grown=("x", 2))  # [B, C, 2 + T, H, W]

FUSED_OPS: tuple[FusedOp, ...] = (
    FusedOp("window_attention", "window_attention",
            inputs=(Input("q"), Input("k_prev"), Input("v_prev"), Input("k_cur"), Input("v_cur"),
                    Input("valid_frames", "I")),
            outputs=(Output("out", like="q"),), attrs=(Attr("prev_frames", int), Attr("units", int)),
            tactics=GPU_TILINGS),
    FusedOp("few_key_attention", "few_key_attention",
            inputs=(Input("q"), Input("k_prev"), Input("v_prev"), Input("k_cur"), Input("v_cur"),
                    Input("valid_frames", "I")),
            outputs=(Output("out", like="q"),), attrs=(Attr("prev_frames", int), Attr("units", int))),
    FusedOp("qk_norm_rope", "qk_norm_rope",
            inputs=(Input("q"), Input("k"), Input("w_q"), Input("w_k"), Input("cos", "F"), Input("sin", "F")),
            outputs=(Output("q_out", like="q"), Output("k_out", like="k")),
            attrs=(Attr("eps", float), Attr("group", int))),
    FusedOp("norm_rope", "qk_norm_rope", inputs=(Input("x"), Input("w"), Input("cos", "F"), Input("sin", "F")),
            outputs=(Output("out", like="x"),), attrs=(Attr("eps", float), Attr("group", int))),
    FusedOp("adaln", "adaln", inputs=(Input("x"), Input("a", "U"), Input("c", "U")),
            outputs=(Output("h", like="x", dtype_of="a"),), attrs=_NORM_ATTRS),
    FusedOp("add_adaln", "adaln",
            inputs=(Input("x"), Input("y", "U"), Input("g", "U"), Input("a", "U"), Input("c", "U")),
            outputs=(Output("x_out", like="x"), Output("h", like="x", dtype_of="a")), attrs=_NORM_ATTRS),
    # The video decoder's (channels-last): a convolution's bias [+ the residual], norm, SiLU, and the
    # next convolution's input: its history, then these frames.
    FusedOp("norm_silu_join", "decoder_norm",
            inputs=(Input("x"), Input("bias"), Input("gamma"), Input("history")),
            outputs=(_JOINED,), attrs=(), channels_last=True),
    FusedOp("add_norm_silu_join", "decoder_norm",
            inputs=(Input("x"), Input("bias"), Input("r"), Input("gamma"), Input("history")),
            outputs=(Output("s", like="r"), _JOINED), attrs=(), channels_last=True),
    # the same of a convolution computed as two (x = [x ; x_tail] along channels)
    FusedOp("split_norm_silu_join", "decoder_norm",
            inputs=(Input("x"), Input("x_tail"), Input("bias"), Input("gamma"), Input("history")),
            outputs=(_JOINED,), attrs=(), channels_last=True),
    FusedOp("split_add_norm_silu_join", "decoder_norm",
            inputs=(Input("x"), Input("x_tail"), Input("bias"), Input("r"), Input("gamma"), Input("history")),
            outputs=(Output("s", like="r"), _JOINED), attrs=(), channels_last=True),
)


def fused_op(name: str) -> FusedOp:
    """The registered op called ``name`` (snake_case) or ``op_type`` (CamelCase)."""
    for op in FUSED_OPS:
        if name in (op.name, op.op_type):
            return op
    raise KeyError(f"no fused op {name!r}; registered: {', '.join(op.name for op in FUSED_OPS)}")


def with_signature(fn: Callable[[dict[str, Any]], Any], signature: inspect.Signature, name: str) -> Callable:
    """A function that shows ``signature`` to the decorators that read one (torch.library, the ONNX
    exporter, tensorrt.plugin) and calls ``fn`` with its arguments bound to those names, in order."""
    def call(*args, **kwargs):
        bound = signature.bind(*args, **kwargs)
        bound.apply_defaults()
        return fn(bound.arguments)
    call.__signature__ = signature
    call.__annotations__ = {p.name: p.annotation for p in signature.parameters.values()
                            if p.annotation is not inspect.Parameter.empty}
    if signature.return_annotation is not inspect.Signature.empty:
        call.__annotations__["return"] = signature.return_annotation
    call.__name__ = call.__qualname__ = name
    return call
