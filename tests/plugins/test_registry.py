"""Every registered fused op is complete: its module holds the reference, launcher, kernel and TensorRT
plan under the op's name and signature; a kernel test compares launcher and reference; the custom op,
the ONNX schema and the ONNX Runtime op exist and compute the reference. A new op without one of
them fails here (its TensorRT plan is compiled in test_tensorrt_plugins.py)."""
import importlib
import importlib.util
import inspect
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
import torch

from wan_trt.export.plugin_ops import DOMAIN, PLUGIN_ATTRS, register_schemas
from wan_trt.plugins.registry import FUSED_OPS, FusedOp
from wan_trt.profiling import WAN_TRT_KERNEL
from tests.plugins.test_tensorrt_plugins import plan_examples

IDS = [op.name for op in FUSED_OPS]


def example(op: FusedOp) -> tuple[list[torch.Tensor], list]:
    """Small fp32 inputs and attributes of each op (int32 valid_frames)."""
    gen = torch.Generator().manual_seed(0)
    def r(*shape):
        return torch.randn(*shape, generator=gen)
    q, kv, x, mod = r(1, 6, 2, 16), r(1, 12, 2, 16), r(1, 6, 8), r(1, 2, 1, 8) + 1
    angles = r(6, 8)
    return {"window_attention": ([q, kv, kv.flip(1), q.flip(1), q * 2, torch.tensor([1], dtype=torch.int32)], [2, 6]),
            "few_key_attention": ([r(4, 3, 2, 16), r(4, 2, 2, 16), r(4, 2, 2, 16), r(4, 3, 2, 16), r(4, 3, 2, 16),
                                   torch.tensor([1], dtype=torch.int32)], [2, 1]),
            "qk_norm_rope": ([r(1, 6, 32), r(1, 6, 32), r(32), r(32), angles.cos(), angles.sin()], [1e-6, 16]),
            "norm_rope": ([r(2, 6, 32), r(32), angles[:3].cos(), angles[:3].sin()], [1e-6, 16]),
            "adaln": ([x, mod, r(1, 2, 1, 8)], [2, 1e-6]),
            "add_adaln": ([x, r(1, 6, 8), r(1, 2, 1, 8), mod, r(8)], [2, 1e-6]),
            "norm_silu_join": ([cl(r(1, 8, 2, 2, 3)), r(8), r(6), cl(r(1, 6, 2, 2, 3))], []),
            "add_norm_silu_join": ([cl(r(1, 8, 2, 2, 3)), r(8), cl(r(1, 6, 2, 2, 3)), r(6), cl(r(1, 6, 2, 2, 3))], []),
            "split_norm_silu_join": ([cl(r(1, 4, 2, 2, 3)), cl(r(1, 4, 2, 2, 3)), r(8), r(6), cl(r(1, 6, 2, 2, 3))], []),
            "split_add_norm_silu_join": ([cl(r(1, 4, 2, 2, 3)), cl(r(1, 4, 2, 2, 3)), r(8), cl(r(1, 6, 2, 2, 3)), r(6),
                                          cl(r(1, 6, 2, 2, 3))], []),
            }[op.name]


def cl(t: torch.Tensor) -> torch.Tensor:
    return t.contiguous(memory_format=torch.channels_last_3d)


def _parameters(fn) -> list[str]:
    return [p.name for p in inspect.signature(fn).parameters.values() if p.kind == p.POSITIONAL_OR_KEYWORD]


@pytest.mark.parametrize("op", FUSED_OPS, ids=IDS)
def test_module_holds_the_ops_functions_under_its_name(op):
    names = [i.name for i in op.inputs] + [a.name for a in op.attrs]
    for role, fn in (("reference", op.reference), ("launcher", op.launch), ("plan", op.plan)):
        assert _parameters(fn)[:len(names)] == names, f"{op.name}: {role} {fn.__name__} takes {_parameters(fn)}"
    assert op.kernel.fn.__name__ == op.kernel_name and WAN_TRT_KERNEL.fullmatch(op.kernel_name)


@pytest.mark.parametrize("op", FUSED_OPS, ids=IDS)
def test_a_kernel_test_compares_launcher_and_reference(op):
    """tests/plugins/test_<module>.py has a test calling both ``<name>(`` and ``reference_<name>(``."""
    module = importlib.import_module(f"tests.plugins.test_{op.module}")
    calls = [re.compile(rf"(?<![\w.]){name}\(") for name in (op.name, f"reference_{op.name}")]
    tests = [fn for name, fn in vars(module).items() if name.startswith("test_") and callable(fn)]
    assert any(all(c.search(inspect.getsource(fn)) for c in calls) for fn in tests), \
        f"no test in {module.__name__} calls both {op.name}(...) and reference_{op.name}(...)"


@pytest.mark.parametrize("op", FUSED_OPS, ids=IDS)
def test_custom_op_computes_the_reference(op):
    import wan_trt.plugins.ops  # noqa: F401  (defines torch.ops.wan_trt.*)
    tensors, attrs = example(op)
    got = getattr(torch.ops.wan_trt, op.name)(*tensors, *attrs)
    want = op.reference(*tensors, *attrs)
    for g, w in zip(*(o if isinstance(o, tuple) else (o,) for o in (got, want))):
        torch.testing.assert_close(g, w, atol=1e-5, rtol=1e-5)


def _single_node_graph(op: FusedOp, tensors: list[torch.Tensor], attrs: list) -> onnx.ModelProto:
    elem = {torch.float32: onnx.TensorProto.FLOAT, torch.int32: onnx.TensorProto.INT32}
    inputs = [onnx.helper.make_tensor_value_info(i.name, elem[t.dtype], list(t.shape))
              for i, t in zip(op.inputs, tensors)]
    want = op.reference(*tensors, *attrs)
    outputs = [onnx.helper.make_tensor_value_info(o.name, onnx.TensorProto.FLOAT, list(w.shape))
               for o, w in zip(op.outputs, want if isinstance(want, tuple) else (want,))]
    node = onnx.helper.make_node(op.op_type, [i.name for i in op.inputs], [o.name for o in op.outputs], domain=DOMAIN,
                                 **dict(zip((a.name for a in op.attrs), attrs)), **PLUGIN_ATTRS)
    graph = onnx.helper.make_graph([node], op.name, inputs, outputs)
    return onnx.helper.make_model(graph, ir_version=10, opset_imports=[onnx.helper.make_opsetid("", 18),
                                                                       onnx.helper.make_opsetid(DOMAIN, 1)])


@pytest.mark.parametrize("op", FUSED_OPS, ids=IDS)
def test_onnx_schema_accepts_the_node(op):
    register_schemas()
    schema = onnx.defs.get_schema(op.op_type, 1, DOMAIN)
    assert [i.name for i in schema.inputs] == [i.name for i in op.inputs]
    assert [o.name for o in schema.outputs] == [o.name for o in op.outputs]
    assert {a.name for a in op.attrs} | set(PLUGIN_ATTRS) == set(schema.attributes)
    onnx.checker.check_model(_single_node_graph(op, *example(op)))


@pytest.mark.skipif(importlib.util.find_spec("onnxruntime_extensions") is None,
                    reason="onnxruntime-extensions (the fused ops on ONNX Runtime) is not installed")
@pytest.mark.parametrize("op", FUSED_OPS, ids=IDS)
def test_onnxruntime_op_computes_the_reference(tmp_path, op):
    import onnxruntime as ort
    from wan_trt.plugins.onnxruntime_ops import contrib_copy, register_reference_ops
    tensors, attrs = example(op)
    onnx.save(_single_node_graph(op, tensors, attrs), str(tmp_path / "op.onnx"))
    options = ort.SessionOptions()
    options.register_custom_ops_library(register_reference_ops())
    with contrib_copy(tmp_path / "op.onnx") as graph:
        session = ort.InferenceSession(str(graph), options, providers=["CPUExecutionProvider"])
    got = session.run(None, {i.name: t.numpy() for i, t in zip(op.inputs, tensors)})
    want = op.reference(*tensors, *attrs)
    for g, w in zip(got, want if isinstance(want, tuple) else (want,)):
        np.testing.assert_allclose(g, w.numpy(), atol=1e-6)


def test_every_op_has_a_plan_example():
    assert set(plan_examples()) == {op.name for op in FUSED_OPS}


@pytest.fixture(scope="module")
def inductor_writes():
    """tests/plugins/written_tensors.py's answer (a subprocess: it needs the kernels compiled, not interpreted)."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    done = subprocess.run([sys.executable, "-m", "tests.plugins.written_tensors"], capture_output=True, text=True,
                          env=env, cwd=Path(__file__).parents[2], timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.splitlines()[-1])


@pytest.mark.parametrize("op", FUSED_OPS, ids=IDS)
def test_inductor_takes_the_kernels_to_write_only_their_outputs(op, inductor_writes):
    """Inductor's analysis of the kernel finds the op's outputs written and none of its inputs. An input it
    takes for written is copied at every launch, and a weight becomes an extra output of an AOTInductor
    graph (a helper returning several values made every pointer passed to it look written)."""
    launches = inductor_writes[op.name]
    assert launches, f"{op.name}: no kernel launch traced"
    for names, inputs in launches:
        assert inputs == [], f"{op.name}: Inductor takes inputs {inputs} for written"
    assert sum(len(names) for names, _ in launches) == len(op.outputs)


def test_inductor_takes_the_fp8_quantization_to_write_only_its_outputs(inductor_writes):
    """The same for the fp8 engines' quantization kernel (no fused op: it has no TensorRT plugin)."""
    assert inductor_writes["quantize_rows_fp8"] == [[["Q", "S"], []]]


def test_plugins_without_triton_say_what_to_install(tmp_path):
    """Triton is not a dependency of the package (CPU torch wheels come without it): `export --ops plugins` ended in
    a traceback (ModuleNotFoundError: triton) from the first fused op's module."""
    script = ("import sys; sys.modules['triton'] = None  # as where it is not installed\n"
              "from wan_trt.cli import main; main()")
    res = subprocess.run([sys.executable, "-c", script, "export", "--config", "universal-small", "--precision", "fp32",
                          "--ops", "plugins", "--out", str(tmp_path / "export")], capture_output=True, text=True)
    assert res.returncode == 1 and "Traceback" not in res.stderr, res.stderr[-3000:]
    assert "--ops plugins" in res.stderr and "pip install triton" in res.stderr, res.stderr[-3000:]
    assert not (tmp_path / "export").exists()
