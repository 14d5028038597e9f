"""The plugin flavour of the graph: the fused ops as custom ONNX nodes TensorRT maps to plugins.

Each registered ``torch.ops.wan_trt.<op>`` (plugins/registry.py) becomes a node ``wan_trt::<Op>`` (domain ``wan_trt``,
version 1) with attributes ``plugin_namespace="wan_trt"``, ``plugin_version="1"`` and
``aot=1``: TensorRT's ONNX parser maps op_type to the plugin name and the namespace to
``wan_trt``, and ``aot=1`` selects the ahead-of-time (Triton-compiled PTX) implementation,
so the engine runs without Python. ONNX schemas are registered so the exporter and the
checker know the nodes' types.
"""
from __future__ import annotations

import onnx
import onnxscript
import torch
from onnx.defs import OpSchema

from wan_trt.plugins.registry import FUSED_OPS, NAMESPACE, TYPE_CONSTRAINTS, FusedOp, with_signature

DOMAIN = NAMESPACE
VERSION = 1
PLUGIN_ATTRS = {"aot": 1, "plugin_namespace": DOMAIN, "plugin_version": "1"}
A = OpSchema.AttrType
ATTR_TYPES = {int: A.INT, float: A.FLOAT}


def op_schema(op: FusedOp) -> OpSchema:
    """The ONNX schema of a registered op: its inputs, outputs and attributes, plus the plugin attributes."""
    attributes = [OpSchema.Attribute(a.name, ATTR_TYPES[a.type], "") for a in op.attrs]
    attributes += [OpSchema.Attribute("aot", A.INT, ""), OpSchema.Attribute("plugin_namespace", A.STRING, ""),
                   OpSchema.Attribute("plugin_version", A.STRING, "")]
    return OpSchema(op.op_type, DOMAIN, VERSION, inputs=[OpSchema.FormalParameter(i.name, i.type) for i in op.inputs],
                    outputs=[OpSchema.FormalParameter(o.name, op.output_type(o)) for o in op.outputs],
                    type_constraints=[(name, list(types), "") for name, types in TYPE_CONSTRAINTS.items()],
                    attributes=attributes)


def register_schemas() -> None:
    """Register the fused ops' ONNX schemas once per process."""
    for op in FUSED_OPS:
        if not onnx.defs.has(op.op_type, DOMAIN):
            onnx.defs.register_schema(op_schema(op))


def emitter(op: FusedOp, opset: onnxscript.values.Opset):
    """The onnxscript function of ``torch.ops.wan_trt.<op.name>``: one ``wan_trt::<OpType>`` node."""
    node = getattr(opset, op.op_type)
    n_inputs = len(op.inputs)

    def emit(args: dict):
        values = list(args.values())
        return node(*values[:n_inputs], **dict(zip(list(args)[n_inputs:], values[n_inputs:])), **PLUGIN_ATTRS)
    return with_signature(emit, op.signature(), op.name)


def translation_table() -> dict:
    """torch op overload -> onnxscript function emitting the custom node (for torch.onnx.export)."""
    import wan_trt.plugins.ops  # noqa: F401  (defines torch.ops.wan_trt.*; deferred: the kernels need triton)

    register_schemas()
    wan = onnxscript.values.Opset(DOMAIN, VERSION)
    return {getattr(torch.ops.wan_trt, op.name).default: emitter(op, wan) for op in FUSED_OPS}


def plugin_node_counts(op_counts: dict[str, int]) -> dict[str, int]:
    """The wan_trt::* entries of a graph's op counts (proof the fused ops are in the graph)."""
    return {k: v for k, v in op_counts.items() if k.startswith(f"{DOMAIN}::")}
