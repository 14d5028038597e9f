"""TensorRT plugins for the fused ops (``tensorrt.plugin``, TensorRT 10.9+ / 11.x), one per entry of
:data:`~wan_trt.plugins.registry.FUSED_OPS`, built from the registry with no per-op code.

Per op ``wan_trt::<OpType>`` (version 1): ``register`` (output shapes and dtypes, from the
registry's outputs), ``autotune`` (for ops with tactics: the kernel's GPU tilings), ``aot_impl``
(the op's ``<name>_plan``: the same Triton kernel compiled to PTX with the launcher's settings,
embedded in the engine, which then runs from C++ or trtexec with no Python) and ``impl`` (the JIT
form, calling the op's launcher on TensorRT's stream). tensorrt.plugin reads the parameter names
and annotations of these functions; they are given the op's signature.
"""
from __future__ import annotations

import inspect
from typing import Any

import torch

from wan_trt.errors import WanTrtError
from wan_trt.plugins.aot import Plan, TensorArg  # also fails early here if triton is missing
from wan_trt.plugins.registry import FUSED_OPS, NAMESPACE, FusedOp, with_signature

# tensorrt.plugin type names of the registry's type constraints (for the autotune combinations). T and U list
# every float type an export gives the activations (bf16 / fp8, fp16 and fp32 graphs), in one order: '|' ties the
# positions that list them, so each combination has one activation type.
TRT_TYPES = {"T": "BF16|FP16|FP32", "U": "BF16|FP16|FP32", "I": "INT32", "F": "FP32"}
_REGISTERED = False


def register_plugins() -> None:
    """Register every fused op with TensorRT's plugin registry (once per process)."""
    global _REGISTERED
    if _REGISTERED:
        return
    from wan_trt.engines.backends.tensorrt import import_tensorrt  # deferred: it imports tensorrt
    import_tensorrt()
    import tensorrt.plugin as trtp

    for op in FUSED_OPS:
        register_plugin(op, trtp)
    _REGISTERED = True


def register_plugin(op: FusedOp, trtp) -> None:
    """``wan_trt::<op.op_type>``: its register, autotune (with tactics), aot_impl and impl functions."""
    plugin = f"{NAMESPACE}::{op.op_type}"
    for decorator, fn in plugin_functions(op, trtp).items():
        getattr(trtp, decorator)(plugin)(fn)


# TensorRT's channels-last formats of 5-D tensors by activation type: DHWC is FP32's only; DHWC8 (channels padded to a
# multiple of 8) is bf16's and fp16's, the same memory as channels-last where C % 8 == 0 (the decoder's 96, 192, 384).
CHANNELS_LAST = {"BF16|FP16": "DHWC8", "FP32": "DHWC"}


def check_channels_last_padding(op: FusedOp, tensors: list[TensorArg]) -> None:
    """Refuse a bf16 or fp16 5-D tensor of a channels-last op whose channels are no multiple of 8: TensorRT hands it
    over as DHWC8, its channels padded to 8, where the kernel reads them dense."""
    for t in tensors:
        channels = t.shape[1] if len(t.shape) == 5 else 0
        if t.dtype in (torch.bfloat16, torch.float16) and channels % 8:
            raise WanTrtError(f"{op.name}: a {t.dtype} tensor of {channels} channels reaches TensorRT's plugin as DHWC8 "
                              "(channels padded to a multiple of 8), which its kernel does not read; export this "
                              "graph with --ops native")


def type_combination(op: FusedOp, floats: str | None = None) -> str:
    """The op's I/O types for ``trtp.AutoTuneCombination``: inputs, then outputs, by type constraint; ``floats``: the
    activation types to list (default: every one an export gives, :data:`TRT_TYPES`)."""
    types = {**TRT_TYPES, **({"T": floats, "U": floats} if floats else {})}
    return ", ".join([types[i.type] for i in op.inputs] + [types[op.output_type(o)] for o in op.outputs])


def tune_combinations(op: FusedOp, ranks: list[int]) -> list[tuple[str, str]]:
    """(types, formats) of each ``trtp.AutoTuneCombination`` of ``op`` whose I/O (inputs, then outputs) have ``ranks``:
    one over every type in linear formats; a channels-last op's 5-D tensors in TensorRT's channels-last format of
    each type (:data:`CHANNELS_LAST`), one combination per format."""
    if not op.channels_last:
        return [(type_combination(op), ", ".join("LINEAR" for _ in ranks))]
    return [(type_combination(op, floats), ", ".join(fmt if rank == 5 else "LINEAR" for rank in ranks))
            for floats, fmt in CHANNELS_LAST.items()]


def trt_tactics(op: FusedOp) -> list[int] | None:
    """The TensorRT tactics advertising the op's tilings: tiling i is tactic i + 1 (custom tactics must be unique
    and non-zero, 0 being TensorRT's default tactic of each format combination); None: no custom tactic."""
    return [i + 1 for i in range(len(op.tactics))] or None


def tiling_of(tactic: int) -> int:
    """The index in ``op.tactics`` (the plan's ``tactic``) of TensorRT's ``tactic``; the default tactic 0 runs
    the first tiling."""
    return max(int(tactic) - 1, 0)


def tune_signature(op: FusedOp) -> inspect.Signature:
    """The autotune function's parameters: the inputs, then ``outputs``. No return annotation: tensorrt.plugin
    takes none, or ``AutoTuneCombination`` / ``List[AutoTuneCombination]``, and refuses a bare ``list``."""
    names = [i.name for i in op.inputs] + ["outputs"]
    return inspect.Signature([inspect.Parameter(name, inspect.Parameter.POSITIONAL_OR_KEYWORD) for name in names])


def plugin_functions(op: FusedOp, trtp) -> dict[str, Any]:
    """decorator name -> the function tensorrt.plugin gets, with the parameter list it requires."""
    p = inspect.Parameter
    kind = p.POSITIONAL_OR_KEYWORD
    outputs, tactic = p("outputs", kind), p("tactic", kind, annotation=int)
    aot_returns = tuple[str | bytes, str | bytes, trtp.KernelLaunchParams, trtp.SymIntExprs]
    n_inputs, n_args = len(op.inputs), len(op.inputs) + len(op.attrs)

    def describe(args: dict):
        """Output descriptors: each output like an input, with another input's dtype and one dim grown
        by another input's where declared."""
        descs = []
        for out in op.outputs:
            desc = args[out.like].like()
            if out.dtype_of is not None:
                desc.dtype = args[out.dtype_of].dtype
            if out.grown is not None:  # a new shape: like()'s shares its ShapeExprs with the input's
                source, dim = out.grown
                shape = list(desc.shape_expr)
                shape[dim] = shape[dim] + args[source].shape_expr[dim]
                desc = trtp.from_shape_expr(trtp.ShapeExprs.from_tuple(tuple(shape)), dtype=desc.dtype)
            descs.append(desc)
        return descs[0] if len(descs) == 1 else tuple(descs)

    def aot(args: dict):
        values = list(args.values())
        tensors = [TensorArg(_shape(d), _torch_dtype(d.dtype)) for d in values[:n_inputs]]
        if op.channels_last:
            check_channels_last_padding(op, tensors)
        return _aot_result(trtp, op.plan(*tensors, *values[n_inputs:n_args], tactic=tiling_of(args["tactic"])))

    def jit(args: dict):
        if op.channels_last:  # TensorRT's buffers reach PyTorch as linear tensors
            raise WanTrtError(f"{op.name}: its TensorRT plugin runs ahead of time only (aot=1)")
        _jit(op.launch, args["outputs"], args["stream"], *list(args.values())[:n_args])

    functions = {"register": with_signature(describe, op.signature(trtp.TensorDesc, returns=True), f"{op.name}_desc")}
    if op.tactics or op.channels_last:  # TensorRT times each tiling and keeps the fastest; formats
        tactics = trt_tactics(op)

        def tune(args: dict):
            ranks = [d.ndim for d in [args[i.name] for i in op.inputs] + list(args["outputs"])]
            return [trtp.AutoTuneCombination(types, formats, tactics) for types, formats in tune_combinations(op, ranks)]
        functions["autotune"] = with_signature(tune, tune_signature(op), f"{op.name}_tune")
    functions["aot_impl"] = with_signature(
        aot, op.signature(extra=[outputs, tactic]).replace(return_annotation=aot_returns), f"{op.name}_aot")
    stream, jit_tactic = p("stream", kind), p("tactic", kind, default=0, annotation=int)
    functions["impl"] = with_signature(jit, op.signature(extra=[outputs, stream, jit_tactic]), f"{op.name}_impl")
    return functions


def _torch_dtype(trt_dtype) -> torch.dtype:
    import tensorrt as trt  # deferred: optional dependency

    from wan_trt.engines.backends.tensorrt import torch_dtypes
    return torch_dtypes(trt)[trt_dtype]


def _shape(desc) -> tuple[int, ...]:
    return tuple(int(d) for d in desc.shape)


def _aot_result(trtp, plan: Plan):
    launch = trtp.KernelLaunchParams()
    launch.grid_x = plan.grid[0]
    if len(plan.grid) > 1:
        launch.grid_y = plan.grid[1]
    launch.block_x = plan.compiled.num_warps * 32
    launch.shared_mem = plan.compiled.shared
    extra = trtp.SymIntExprs(len(plan.scalars))
    for i, value in enumerate(plan.scalars):
        extra[i] = trtp.SymInt32(value)
    return plan.compiled.name, plan.compiled.ptx, launch, extra


def _jit(fn, outputs, stream, *args):
    """Run a PyTorch launcher on TensorRT's stream, writing into TensorRT's output buffers."""
    with torch.cuda.stream(torch.cuda.ExternalStream(stream)):
        results = fn(*(torch.as_tensor(a, device="cuda") if not isinstance(a, (int, float)) else a for a in args))
        results = results if isinstance(results, tuple) else (results,)
        for out, res in zip(outputs, results):
            torch.as_tensor(out, device="cuda").copy_(res)
