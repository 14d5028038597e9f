"""The fused ops inside the model, the plugin-flavoured graph, and the TensorRT plugins."""
import importlib.util

import pytest
import torch

from wan_trt.config import load_config
from wan_trt.engines.torch_runner import TorchRunner
from wan_trt.export.manifest import Manifest
from wan_trt.export.transformer import export_transformer
from wan_trt.model import build_model
from wan_trt.spec import PassSpec
from wan_trt.validate.stream import compare_stream
from wan_trt.validate.transformer import check_export
from tests.conftest import SMALL

HAS_TRT = importlib.util.find_spec("tensorrt") is not None
PLUGIN_OPS = ["wan_trt::WindowAttention", "wan_trt::QkNormRope", "wan_trt::Adaln", "wan_trt::AddAdaln"]


def _fused_and_native(name):
    cfg = load_config(name)
    return cfg, build_model(cfg, seed=1), build_model(cfg, seed=1).use_plugins(), PassSpec.from_config(cfg, "fp32")


@pytest.mark.parametrize("name", SMALL)
def test_model_with_fused_ops_equals_the_reference(name):
    cfg, native, fused, spec = _fused_and_native(name)
    feeds = spec.sample_inputs(seed=3)
    a, b = TorchRunner(native, spec).infer(feeds), TorchRunner(fused, spec).infer(feeds)
    for key in a:
        torch.testing.assert_close(b[key], a[key], atol=2e-5, rtol=1e-5)


@pytest.mark.parametrize("name, blocks", [("gta_drive-small", 4)] + [
    pytest.param(n, 9, marks=pytest.mark.slow) for n in SMALL])  # the interpreter takes ~70 s per 9 blocks
def test_stream_with_fused_ops_equals_upstream_semantics(name, blocks):
    cfg, native, fused, spec = _fused_and_native(name)
    report = compare_stream(native, TorchRunner(fused, spec), blocks, seed=2)  # past the window: eviction
    assert max(s.rel_l2 for s in report.blocks) < 1e-5


@pytest.mark.skipif(importlib.util.find_spec("onnxruntime_extensions") is None,
                    reason="onnxruntime-extensions (the plugin graph's ops on ONNX Runtime) is not installed")
@pytest.mark.parametrize("name", SMALL)
def test_plugin_graph_passes_the_check_and_counts_its_plugins(tmp_path, name):
    cfg = load_config(name)
    manifest = export_transformer(cfg, tmp_path / "plugins", "fp32", seed=1, ops="plugins")
    layers = cfg.model.num_layers
    counts = manifest.op_counts
    assert counts["wan_trt::WindowAttention"] == layers and counts["wan_trt::QkNormRope"] == layers
    assert counts["wan_trt::AddAdaln"] == layers and counts["wan_trt::Adaln"] == 2 * layers + 1  # + the head
    assert "Attention" not in counts or counts["Attention"] == layers  # only cross-attention stays native
    report = check_export(tmp_path / "plugins", "cpu", blocks=8, seed=1)
    assert report.ok, report.table()
    assert Manifest.read(tmp_path / "plugins").ops == "plugins"


_PTX_FACTS = """
import json, torch
from wan_trt.plugins.tensorrt_plugins import ATTENTION_TACTICS, adaln_plan, attention_plan, qk_norm_rope_plan
facts = {}
for tactic in range(len(ATTENTION_TACTICS)):
    compiled, grid, scalars = attention_plan((1, 2640, 12, 128), 2640, torch.bfloat16, 3, 880, tactic, arch=90)
    facts[f"attention{tactic}"] = {"ptx": [s in compiled.ptx for s in (".entry", "cp.async", "wgmma.mma_async")],
                                   "grid": list(grid), "scalars": len(scalars)}
qk = qk_norm_rope_plan((1, 2640, 1536), torch.bfloat16, 64, 1e-6, arch=90)[0].ptx
fused = adaln_plan((1, 2640, 1536), torch.bfloat16, torch.bfloat16, (1, 3, 1, 1536), 3, 1e-6, fused=True,
                   arch=90)[0].ptx
facts["norms"] = [s in ptx for ptx in (qk, fused) for s in (".entry", "ld.global.v4")]
print(json.dumps(facts))
"""


def test_aot_kernels_compile_to_ptx():
    """The TensorRT AOT plans compile for an H100 (sm_90) with no GPU here: every attention tactic, with
    its K/V loads pipelined through cp.async (the plans pass the 16-divisibility the JIT launcher would)
    and its dots on wgmma; the norm kernels with 16-byte vector loads. In a child process, because
    under TRITON_INTERPRET the kernels cannot be compiled."""
    import json
    import os
    import subprocess
    import sys
    from wan_trt.plugins.tensorrt_plugins import ATTENTION_TACTICS
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    run = subprocess.run([sys.executable, "-c", _PTX_FACTS], env=env, capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-3000:]
    facts = json.loads(run.stdout.strip().splitlines()[-1])
    for i, tiling in enumerate(ATTENTION_TACTICS):
        grid = [(2640 + tiling.block_m - 1) // tiling.block_m, 12]
        assert facts[f"attention{i}"] == {"ptx": [True, True, True], "grid": grid, "scalars": 18}, f"tactic {i}"
    assert all(facts["norms"]), facts["norms"]


@pytest.mark.tensorrt
@pytest.mark.skipif(not HAS_TRT, reason="TensorRT is not installed (it cannot be installed in this workplace)")
def test_tensorrt_plugins_register_and_build(tmp_path):
    import tensorrt.plugin as trtp
    from wan_trt.engines.tensorrt import build_tensorrt, inspect_tensorrt
    from wan_trt.plugins.tensorrt_plugins import register_plugins
    register_plugins()
    for op in PLUGIN_OPS:
        assert getattr(trtp.op.wan_trt, op.split("::")[1]) is not None
    export_transformer(load_config("universal-small"), tmp_path / "p", "bf16", seed=1, ops="plugins")
    engine = build_tensorrt(tmp_path / "p")
    assert inspect_tensorrt(engine)["counts"]["plugin_layers"] >= 4 * 5
