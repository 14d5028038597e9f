"""The plugin flavour of the graph: the fused ops as custom ONNX nodes TensorRT maps to plugins.

Each ``torch.ops.wan_trt.<op>`` becomes a node ``wan_trt::<Op>`` (domain ``wan_trt``,
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

DOMAIN = "wan_trt"
VERSION = 1
FLOAT_TYPES = ["tensor(float)", "tensor(float16)", "tensor(bfloat16)"]
PLUGIN_ATTRS = {"aot": 1, "plugin_namespace": DOMAIN, "plugin_version": "1"}
A = OpSchema.AttrType

# op_type -> (inputs, outputs, attributes), types: T (activations), U (second float type), I (int32), F (fp32)
SCHEMAS = {
    "WindowAttention": ([("q", "T"), ("k_prev", "T"), ("v_prev", "T"), ("k_cur", "T"), ("v_cur", "T"),
                         ("valid_frames", "I")], [("out", "T")], [("prev_frames", A.INT), ("units", A.INT)]),
    "QkNormRope": ([("q", "T"), ("k", "T"), ("w_q", "T"), ("w_k", "T"), ("cos", "F"), ("sin", "F")],
                   [("q_out", "T"), ("k_out", "T")], [("eps", A.FLOAT)]),
    "Adaln": ([("x", "T"), ("a", "U"), ("c", "U")], [("h", "U")], [("frames", A.INT), ("eps", A.FLOAT)]),
    "AddAdaln": ([("x", "T"), ("y", "U"), ("g", "U"), ("a", "U"), ("c", "U")], [("x_out", "T"), ("h", "U")],
                 [("frames", A.INT), ("eps", A.FLOAT)]),
}


def register_schemas() -> None:
    """Register the custom ops' ONNX schemas once per process."""
    for name, (inputs, outputs, attrs) in SCHEMAS.items():
        if onnx.defs.has(name, DOMAIN):
            continue
        attributes = [OpSchema.Attribute(a, t, "") for a, t in attrs]
        attributes += [OpSchema.Attribute("aot", A.INT, ""), OpSchema.Attribute("plugin_namespace", A.STRING, ""),
                       OpSchema.Attribute("plugin_version", A.STRING, "")]
        onnx.defs.register_schema(OpSchema(
            name, DOMAIN, VERSION, inputs=[OpSchema.FormalParameter(n, t) for n, t in inputs],
            outputs=[OpSchema.FormalParameter(n, t) for n, t in outputs],
            type_constraints=[("T", FLOAT_TYPES, ""), ("U", FLOAT_TYPES, ""), ("I", ["tensor(int32)"], ""),
                              ("F", ["tensor(float)"], "")],
            attributes=attributes))


def translation_table() -> dict:
    """torch op overload -> onnxscript function emitting the custom node (for torch.onnx.export)."""
    import wan_trt.plugins.ops  # noqa: F401  (defines torch.ops.wan_trt.*)

    register_schemas()
    wan = onnxscript.values.Opset(DOMAIN, VERSION)

    def window_attention(q, k_prev, v_prev, k_cur, v_cur, valid_frames, prev_frames: int, units: int):
        return wan.WindowAttention(q, k_prev, v_prev, k_cur, v_cur, valid_frames, prev_frames=prev_frames,
                                   units=units, **PLUGIN_ATTRS)

    def qk_norm_rope(q, k, w_q, w_k, cos, sin, eps: float):
        return wan.QkNormRope(q, k, w_q, w_k, cos, sin, eps=eps, **PLUGIN_ATTRS)

    def adaln(x, a, c, frames: int, eps: float):
        return wan.Adaln(x, a, c, frames=frames, eps=eps, **PLUGIN_ATTRS)

    def add_adaln(x, y, g, a, c, frames: int, eps: float):
        return wan.AddAdaln(x, y, g, a, c, frames=frames, eps=eps, **PLUGIN_ATTRS)

    ops = torch.ops.wan_trt
    return {ops.window_attention.default: window_attention, ops.qk_norm_rope.default: qk_norm_rope,
            ops.adaln.default: adaln, ops.add_adaln.default: add_adaln}


def plugin_node_counts(op_counts: dict[str, int]) -> dict[str, int]:
    """The wan_trt::* entries of a graph's op counts (proof the fused ops are in the graph)."""
    return {k: v for k, v in op_counts.items() if k.startswith(f"{DOMAIN}::")}
