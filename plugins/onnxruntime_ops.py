"""The fused ops for ONNX Runtime (CPU): onnxruntime-extensions Python ops backed by the
``reference_*`` functions, so the plugin-flavoured graph can be checked where TensorRT is absent.

onnxruntime-extensions serves Python ops from the ``ai.onnx.contrib`` domain; a plugin graph
is rewritten to that domain into a temporary copy that ONNX Runtime loads, removed once it has.
"""
from __future__ import annotations

import contextlib
import tempfile
from pathlib import Path
from typing import Iterator

import numpy as np
import onnx
import torch

from wan_trt.errors import WanTrtError
from wan_trt.plugins.registry import FUSED_OPS, FusedOp

CONTRIB = "ai.onnx.contrib"
_REGISTERED = False


def _t(array) -> torch.Tensor:
    return torch.from_numpy(np.ascontiguousarray(array))


def register_reference_ops() -> str:
    """Register every fused op with onnxruntime-extensions once; returns its custom-op library path."""
    global _REGISTERED
    try:
        from onnxruntime_extensions import PyCustomOpDef, get_library_path, onnx_op
    except ImportError:
        raise WanTrtError("checking a --ops plugins graph on ONNX Runtime needs onnxruntime-extensions: "
                          "pip install onnxruntime-extensions") from None
    if _REGISTERED:
        return get_library_path()
    for op in FUSED_OPS:
        _register(op, onnx_op, PyCustomOpDef)
    _REGISTERED = True
    return get_library_path()


def _register(op: FusedOp, onnx_op, defs) -> None:
    """One op as an onnxruntime-extensions Python op computing its reference (the graphs checked on
    ONNX Runtime are fp32: every float tensor is fp32)."""
    reference = op.reference
    attrs = {"aot": defs.dt_int64, "plugin_namespace": defs.dt_string, "plugin_version": defs.dt_string}
    attrs |= {a.name: defs.dt_int64 if a.type is int else defs.dt_float for a in op.attrs}

    def run(*arrays, **values):
        out = reference(*(_t(a) for a in arrays), *(values[a.name] for a in op.attrs))
        return tuple(o.numpy() for o in out) if isinstance(out, tuple) else out.numpy()

    onnx_op(op_type=op.op_type, inputs=[defs.dt_int32 if i.type == "I" else defs.dt_float for i in op.inputs],
            outputs=[defs.dt_float] * len(op.outputs), attrs=attrs)(run)


def has_plugin_nodes(model: onnx.ModelProto, domain: str = "wan_trt") -> bool:
    return any(n.domain == domain for n in model.graph.node)


@contextlib.contextmanager
def contrib_copy(graph: Path, domain: str = "wan_trt") -> Iterator[Path]:
    """A temporary copy of ``graph`` with the plugin nodes moved to onnxruntime-extensions' domain, removed on
    exit (ONNX Runtime holds what it needs once its session is made)."""
    from wan_trt.export.plugin_ops import check_plugin_nodes  # deferred: it imports the fused ops' registry
    model = onnx.load(str(graph))
    check_plugin_nodes(model)  # the reference ops would run any version or attributes; TensorRT would not
    for node in model.graph.node:
        if node.domain == domain:
            node.domain = CONTRIB
    imports = [o for o in model.opset_import if o.domain != domain]
    del model.opset_import[:]
    model.opset_import.extend(imports + [onnx.helper.make_opsetid(CONTRIB, 1)])
    with tempfile.TemporaryDirectory(prefix="wan_trt_ort_") as scratch:
        out = Path(scratch) / graph.name
        onnx.save(model, str(out), save_as_external_data=model.ByteSize() > 1_800_000_000)
        yield out
