"""Structural checks of an exported ONNX graph against its spec, and op counts.

A graph passes when ONNX's checker accepts it, its inputs and outputs are exactly the
spec's (names, order, static shapes, element types), and no tensor in it is complex or
float64 (TensorRT has neither): no initializer, cast or other node making one, constant or typed
value, in the graph, its local functions or their subgraphs.
"""
from __future__ import annotations

from collections import Counter
from pathlib import Path

import onnx
from google.protobuf.message import DecodeError

from wan_trt.errors import WanTrtError
from wan_trt.spec import PassSpec

ONNX_TYPES = {"float32": onnx.TensorProto.FLOAT, "float16": onnx.TensorProto.FLOAT16,
              "bfloat16": onnx.TensorProto.BFLOAT16, "int32": onnx.TensorProto.INT32,
              "int64": onnx.TensorProto.INT64}
FORBIDDEN = {onnx.TensorProto.COMPLEX64: "complex64", onnx.TensorProto.COMPLEX128: "complex128",
             onnx.TensorProto.DOUBLE: "float64"}


def load_structure(path: Path) -> onnx.ModelProto:
    """The graph without its external weights (enough for structure and op counts); a file that does not parse is
    refused naming it (one damaged with its digest re-recorded, or rewritten after it was verified)."""
    try:
        return onnx.load(str(path), load_external_data=False)
    except (DecodeError, ValueError, OSError) as exc:  # the parser says why
        raise WanTrtError(f"{path}: not a readable ONNX graph ({type(exc).__name__}: {exc}); re-export it with "
                          "`wan-trt export --overwrite`") from None


def op_counts(model: onnx.ModelProto) -> dict[str, int]:
    """Node counts by ``domain::op_type`` (plain op_type for the default domain)."""
    counts = Counter((f"{n.domain}::{n.op_type}" if n.domain not in ("", "ai.onnx") else n.op_type)
                     for n in model.graph.node)
    return dict(counts.most_common())


def _graphs(model: onnx.ModelProto):
    """(where, graph or function) of the model's graph, its local functions and every subgraph inside them."""
    todo = [("graph", model.graph)] + [(f"function '{f.name}'", f) for f in model.functions]
    while todo:
        where, graph = todo.pop()
        yield where, graph
        for node in graph.node:
            for attr in node.attribute:
                subgraphs = [attr.g] if attr.type == onnx.AttributeProto.GRAPH else list(attr.graphs)
                todo += [(f"{where}, node '{node.name}'", g) for g in subgraphs]


TYPE_ATTRIBUTES = ("to", "dtype", "output_dtype")  # the element type a node makes (Cast, EyeLike, Random*, ...)


def _attribute_tensors(attr: onnx.AttributeProto) -> tuple[list[onnx.TensorProto], list[onnx.SparseTensorProto]]:
    """The dense and the sparse tensors an attribute holds."""
    A = onnx.AttributeProto
    dense = [attr.t] if attr.type == A.TENSOR else list(attr.tensors) if attr.type == A.TENSORS else []
    sparse = [attr.sparse_tensor] if attr.type == A.SPARSE_TENSOR else \
        list(attr.sparse_tensors) if attr.type == A.SPARSE_TENSORS else []
    return dense, sparse


def stored_tensors(model: onnx.ModelProto) -> list[onnx.TensorProto]:
    """Every tensor the model stores, wherever its data lies: initializers (sparse ones' values and indices)
    and tensor attributes (lists and sparse ones included), in the graph, its local functions and every
    subgraph."""
    tensors = []
    for _, graph in _graphs(model):
        sparse = list(getattr(graph, "sparse_initializer", ()))
        tensors += list(getattr(graph, "initializer", ()))
        for node in graph.node:
            for attr in node.attribute:
                dense, held = _attribute_tensors(attr)
                tensors += dense
                sparse += held
        tensors += [t for s in sparse for t in (s.values, s.indices)]
    return tensors


def forbidden_types(model: onnx.ModelProto) -> list[str]:
    """Every place a complex or float64 tensor appears inside the graph (its own inputs and outputs are
    checked against the spec apart): initializers, nodes that make one (casts, ``dtype`` attributes),
    constants (Constant, ConstantOfShape, any tensor attribute, sparse ones included), typed values, in the
    graph, its local functions and every subgraph (with the subgraphs' inputs and outputs)."""
    problems = []
    for where, graph in _graphs(model):
        for node in graph.node:
            for attr in node.attribute:
                if attr.name in TYPE_ATTRIBUTES and attr.type == onnx.AttributeProto.INT and attr.i in FORBIDDEN:
                    problems.append(f"{where}: node '{node.name}' makes {FORBIDDEN[attr.i]} ({attr.name})")
                dense, sparse = _attribute_tensors(attr)
                problems += [f"{where}: node '{node.name}' holds a {FORBIDDEN[t.data_type]} constant ({attr.name})"
                             for t in dense + [s.values for s in sparse] if t.data_type in FORBIDDEN]
        initializers = [*getattr(graph, "initializer", ()),
                        *(sparse.values for sparse in getattr(graph, "sparse_initializer", ()))]
        problems += [f"{where}: initializer '{t.name}' is {FORBIDDEN[t.data_type]}"
                     for t in initializers if t.data_type in FORBIDDEN]
        values = list(getattr(graph, "value_info", ()))
        if graph is not model.graph and isinstance(graph, onnx.GraphProto):
            values += [*graph.input, *graph.output]
        problems += [f"{where}: value '{v.name}' is {FORBIDDEN[v.type.tensor_type.elem_type]}"
                     for v in values if v.type.tensor_type.elem_type in FORBIDDEN]
    return problems


def _value_signature(value: onnx.ValueInfoProto) -> tuple[tuple, int]:
    t = value.type.tensor_type
    dims = tuple(d.dim_value if d.HasField("dim_value") else d.dim_param for d in t.shape.dim)
    return dims, t.elem_type


def check_graph(path: Path, spec: PassSpec) -> dict[str, int]:
    """Raise WanTrtError if the graph at ``path`` breaks the spec; return its op counts."""
    onnx.checker.check_model(str(path))  # path form: works for graphs with external data
    model = load_structure(path)
    problems = []
    for kind, values, specs in (("input", model.graph.input, spec.inputs), ("output", model.graph.output,
                                                                           spec.outputs)):
        names = [v.name for v in values]
        if names != [t.name for t in specs]:
            problems.append(f"{kind}s are {names}, spec says {[t.name for t in specs]}")
            continue
        for value, t in zip(values, specs):
            dims, elem = _value_signature(value)
            if dims != t.shape or elem != ONNX_TYPES[t.dtype]:
                problems.append(f"{kind} '{t.name}' is {list(dims)} type {elem}, spec says {list(t.shape)} {t.dtype}")
    inputs = {v.name for v in model.graph.input}
    for init in model.graph.initializer:
        if init.name in inputs:
            problems.append(f"input '{init.name}' has a constant (an initializer) a runtime may take instead")
    problems += forbidden_types(model)
    if problems:
        raise WanTrtError(f"exported graph {path} breaks its spec:\n  " + "\n  ".join(problems))
    from wan_trt.export.plugin_ops import check_plugin_nodes  # deferred: it imports the fused ops' registry
    check_plugin_nodes(model)
    return op_counts(model)
