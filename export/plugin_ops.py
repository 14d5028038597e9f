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


def check_plugin_nodes(model: onnx.ModelProto) -> None:
    """Refuse ``wan_trt`` nodes that are not the registered ops as exported: an unknown op type, another version
    of the domain, or plugin attributes (``aot``, ``plugin_namespace``, ``plugin_version``) other than
    :data:`PLUGIN_ATTRS`. ONNX Runtime's reference ops run any of them; TensorRT would find no such plugin."""
    from wan_trt.errors import WanTrtError
    versions = {o.version for o in model.opset_import if o.domain == DOMAIN}
    if any(n.domain == DOMAIN for n in model.graph.node) and versions != {VERSION}:
        shown = ", ".join(map(str, sorted(versions))) or "none"
        raise WanTrtError(f"the graph imports the {DOMAIN} domain at version {shown}; wan-trt's plugins are version "
                          f"{VERSION}: re-export it")
    known = {op.op_type for op in FUSED_OPS}
    for node in model.graph.node:
        if node.domain != DOMAIN:
            continue
        if node.op_type not in known:
            raise WanTrtError(f"node {node.name}: {DOMAIN}::{node.op_type} is no registered op "
                              f"({', '.join(sorted(known))})")
        attrs = {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}
        for name, value in PLUGIN_ATTRS.items():
            got = attrs.get(name)
            got = got.decode() if isinstance(got, bytes) else got
            if got != value:
                raise WanTrtError(f"node {node.name} ({node.op_type}): {name} is {got!r}, wan-trt's plugins take "
                                  f"{value!r}: re-export it")


def plugin_node_counts(op_counts: dict[str, int]) -> dict[str, int]:
    """The wan_trt::* entries of a graph's op counts (proof the fused ops are in the graph)."""
    return {k: v for k, v in op_counts.items() if k.startswith(f"{DOMAIN}::")}
