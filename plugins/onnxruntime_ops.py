"""The fused ops for ONNX Runtime (CPU): onnxruntime-extensions Python ops backed by the
``reference_*`` functions, so the plugin-flavoured graph can be checked where TensorRT is absent.

onnxruntime-extensions serves Python ops from the ``ai.onnx.contrib`` domain; a plugin graph
is rewritten to that domain into a temporary copy before ONNX Runtime loads it.
"""
from __future__ import annotations

import tempfile
from pathlib import Path

import numpy as np
import onnx
import torch

from wan_trt.errors import WanTrtError
from wan_trt.plugins import adaln, qk_norm_rope, window_attention

CONTRIB = "ai.onnx.contrib"
_REGISTERED = False


def _t(array) -> torch.Tensor:
    return torch.from_numpy(np.ascontiguousarray(array))


def register_reference_ops() -> str:
    """Register the four ops with onnxruntime-extensions once; returns its custom-op library path."""
    global _REGISTERED
    try:
        from onnxruntime_extensions import PyCustomOpDef, get_library_path, onnx_op
    except ImportError:
        raise WanTrtError("checking a --ops plugins graph on ONNX Runtime needs onnxruntime-extensions: "
                          "pip install onnxruntime-extensions") from None
    if _REGISTERED:
        return get_library_path()
    f32, i32 = PyCustomOpDef.dt_float, PyCustomOpDef.dt_int32
    plugin = {"aot": PyCustomOpDef.dt_int64, "plugin_namespace": PyCustomOpDef.dt_string,
              "plugin_version": PyCustomOpDef.dt_string}

    @onnx_op(op_type="WindowAttention", inputs=[f32] * 5 + [i32], outputs=[f32],
             attrs={**plugin, "prev_frames": PyCustomOpDef.dt_int64, "units": PyCustomOpDef.dt_int64})
    def _window_attention(q, kp, vp, kc, vc, valid, **attrs):
        return window_attention.reference_window_attention(
            _t(q), _t(kp), _t(vp), _t(kc), _t(vc), _t(valid), attrs["prev_frames"], attrs["units"]).numpy()

    @onnx_op(op_type="QkNormRope", inputs=[f32] * 6, outputs=[f32, f32], attrs={**plugin, "eps": PyCustomOpDef.dt_float})
    def _qk_norm_rope(q, k, wq, wk, cos, sin, **attrs):
        out = qk_norm_rope.reference_qk_norm_rope(_t(q), _t(k), _t(wq), _t(wk), _t(cos), _t(sin), attrs["eps"])
        return tuple(o.numpy() for o in out)

    norm_attrs = {**plugin, "frames": PyCustomOpDef.dt_int64, "eps": PyCustomOpDef.dt_float}

    @onnx_op(op_type="Adaln", inputs=[f32] * 3, outputs=[f32], attrs=norm_attrs)
    def _adaln(x, a, c, **attrs):
        return adaln.reference_adaln(_t(x), _t(a), _t(c), attrs["frames"], attrs["eps"]).numpy()

    @onnx_op(op_type="AddAdaln", inputs=[f32] * 5, outputs=[f32, f32], attrs=norm_attrs)
    def _add_adaln(x, y, g, a, c, **attrs):
        out = adaln.reference_add_adaln(_t(x), _t(y), _t(g), _t(a), _t(c), attrs["frames"], attrs["eps"])
        return tuple(o.numpy() for o in out)

    _REGISTERED = True
    return get_library_path()


def has_plugin_nodes(model: onnx.ModelProto, domain: str = "wan_trt") -> bool:
    return any(n.domain == domain for n in model.graph.node)


def contrib_copy(graph: Path, domain: str = "wan_trt") -> Path:
    """A temporary copy of ``graph`` with the plugin nodes moved to onnxruntime-extensions' domain."""
    model = onnx.load(str(graph))
    for node in model.graph.node:
        if node.domain == domain:
            node.domain = CONTRIB
    imports = [o for o in model.opset_import if o.domain != domain]
    del model.opset_import[:]
    model.opset_import.extend(imports + [onnx.helper.make_opsetid(CONTRIB, 1)])
    out = Path(tempfile.mkdtemp(prefix="wan_trt_ort_")) / graph.name
    onnx.save(model, str(out), save_as_external_data=model.ByteSize() > 1_800_000_000)
    return out
