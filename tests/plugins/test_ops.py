"""The fused ops inside the model, the plugin-flavoured graph, and the TensorRT plugins."""
import importlib.util
import json

import pytest
import torch

from wan_trt.config_load import load_config
from wan_trt.engines.backends.torch import TorchRunner
from wan_trt.export.manifest import Manifest
from wan_trt.export.transformer import export_transformer
from wan_trt.model import build_model
from wan_trt.plugins.registry import FUSED_OPS, NAMESPACE
from wan_trt.spec import PassSpec
from wan_trt.validate.stream import compare_stream
from wan_trt.validate.check import CheckOptions, check_export, report_path
from tests.conftest import SMALL

PLUGIN_OPS = [f"{NAMESPACE}::{op.op_type}" for op in FUSED_OPS]


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


@pytest.mark.parametrize("name, blocks", [("gta_drive-small", 3)] + [
    pytest.param(n, 9, marks=pytest.mark.slow) for n in SMALL])  # the interpreter takes ~25 s a block
def test_stream_with_fused_ops_equals_upstream_semantics(name, blocks):
    """Past the window: gta_drive keeps one previous frame, so its third block reads a cached frame that
    overwrote an earlier one (eviction)."""
    cfg, native, fused, spec = _fused_and_native(name)
    report = compare_stream(native, TorchRunner(fused, spec), blocks, seed=2)
    assert max(s.rel_l2 for s in report.blocks) < 1e-5


@pytest.mark.skipif(importlib.util.find_spec("onnxruntime_extensions") is None,
                    reason="onnxruntime-extensions (the plugin graph's ops on ONNX Runtime) is not installed")
@pytest.mark.parametrize("name", SMALL)
def test_plugin_graph_passes_the_check_and_counts_its_plugins(tmp_path, name):
    cfg = load_config(name)
    manifest = export_transformer(cfg, tmp_path / "plugins", "fp32", seed=1, ops="plugins")
    layers = cfg.model.num_layers
    counts = manifest.op_counts
    actions = [m for m in build_model(cfg, seed=1).modules() if type(m).__name__ == "ActionModule"]
    mouse = sum(m.enable_mouse for m in actions)  # the mouse attentions' q/k norm + RoPE is fused too
    assert counts["wan_trt::WindowAttention"] == layers and counts["wan_trt::QkNormRope"] == layers + mouse
    # a residual add inside the norm that reads the sum, in each layer: its norm3 (the self-attention's), its
    # FFN norm (the cross-attention's, or the action module's last branch's) and the next layer's first norm
    # (the FFN's; the head's after the last layer); only the first layer's input norm is a plain adaln
    assert counts["wan_trt::AddAdaln"] == 3 * layers and counts["wan_trt::Adaln"] == 1
    assert counts.get("wan_trt::FewKeyAttention", 0) == sum(m.enable_mouse + m.enable_keyboard for m in actions) > 0
    keyboard = sum(m.enable_keyboard for m in actions)  # the keyboard attentions' queries: norm + RoPE fused
    assert counts.get("wan_trt::NormRope", 0) == keyboard + 1 and keyboard > 0  # + every layer's context k
    assert "Attention" not in counts or counts["Attention"] == layers  # only cross-attention stays native
    report = check_export(tmp_path / "plugins", CheckOptions(provider="cpu", blocks=8, seed=1))
    assert report.ok, report.table()
    assert Manifest.read(tmp_path / "plugins").ops == "plugins"
    # the plugin nodes ran as the ops' PyTorch references: the report says so, not only that it passed
    written = json.loads(report_path(tmp_path / "plugins", report.backend).read_text())
    for said in (report.as_dict()["notes"], written["notes"], [report.table().splitlines()[-1]]):
        assert len(said) == 1 and "ran as wan-trt's PyTorch reference functions" in said[0], said


@pytest.mark.skipif(not torch.cuda.is_available(), reason="the fused FFN epilogue runs on CUDA only (cuBLASLt)")
@pytest.mark.parametrize("dtype, atol", [(torch.float32, 1e-4), (torch.bfloat16, 3e-2)])
def test_ffn_with_gelu_in_the_gemm_epilogue_equals_the_ffn(dtype, atol):
    """On CUDA the plugin path's FFN runs the up-projection's bias + tanh GELU inside the GEMM; it must be
    the model's FFN (tanh GELU, not erf) within the precision's rounding."""
    from wan_trt.model.transformer import CausalWanAttentionBlock
    cfg = load_config("universal")
    block = CausalWanAttentionBlock(cfg, layer=1).to("cuda", dtype)
    h = torch.randn(1, 2640, cfg.model.dim, device="cuda", dtype=dtype)
    with torch.no_grad():
        fused, native = block._ffn_fused(h), block.ffn(h)
        exact_gelu = block.ffn[2](torch.nn.functional.gelu(block.ffn[0](h).float()).to(dtype))
    assert (fused.float() - native.float()).abs().max() < atol
    if dtype == torch.float32:  # the tanh GELU, not erf: nearer the model's FFN than erf's is
        assert (native - exact_gelu).abs().max() > 4 * (fused - native).abs().max()


def _set_plugin_version(model):
    for node in model.graph.node:
        if node.domain == "wan_trt":
            next(a for a in node.attribute if a.name == "plugin_version").s = b"2"


def _jit_plugins(model):
    for node in model.graph.node:
        if node.domain == "wan_trt":
            next(a for a in node.attribute if a.name == "aot").i = 0


def _domain_version_2(model):
    next(o for o in model.opset_import if o.domain == "wan_trt").version = 2


def _unknown_op(model):
    next(n for n in model.graph.node if n.domain == "wan_trt").op_type = "WindowAttentionV2"


@pytest.mark.parametrize("edit, phrase", [(_set_plugin_version, "plugin_version"), (_jit_plugins, "aot"),
                                          (_domain_version_2, "version 2"), (_unknown_op, "WindowAttentionV2")])
def test_a_plugin_node_that_is_not_the_registered_op_is_refused(tmp_path, edit, phrase):
    """ONNX Runtime's reference ops ignored the plugin identity: a graph naming plugin version 2, the JIT
    implementation (aot=0) or opset version 2 of the wan_trt domain passed the check, though TensorRT would find
    no such plugin (or need Python at run time)."""
    from wan_trt.errors import WanTrtError
    from wan_trt.export.plugin_ops import check_plugin_nodes
    import onnx
    export_transformer(load_config("universal-small"), tmp_path / "p", "fp32", seed=1, ops="plugins")
    model = onnx.load(str(tmp_path / "p" / "model.onnx"), load_external_data=False)
    check_plugin_nodes(model)  # as exported
    edit(model)
    with pytest.raises(WanTrtError, match=phrase):
        check_plugin_nodes(model)
