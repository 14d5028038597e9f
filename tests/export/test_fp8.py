"""The fp8 graph: standard Q/DQ around its FP8 GEMMs, the ONNX checker, and what refuses fp8."""
from __future__ import annotations

import numpy as np
import onnx
import pytest
import torch

from wan_trt.config_load import load_config
from wan_trt.engines.backends.aoti import build_aoti
from wan_trt.engines.backends.onnxruntime import OnnxRuntimeRunner
from wan_trt.engines.stream import StreamOptions, run_stream
from wan_trt.errors import WanTrtError
from wan_trt.export.decoder import export_decoder
from wan_trt.export.fp8 import translation_table
from wan_trt.export.graph import check_graph, load_structure
from wan_trt.export.manifest import Manifest, reference_model, verify_weights
from wan_trt.export.transformer import export_transformer
from wan_trt.model.fp8 import FP8_LINEARS, Fp8Linear

CFG = "universal-small"


@pytest.fixture(scope="module")
def fp8_export(tmp_path_factory):
    out = tmp_path_factory.mktemp("fp8") / "export"
    export_transformer(load_config(CFG), out, "fp8")
    return out


def test_fp8_graph_holds_qdq_pairs_and_fp8_weights(fp8_export):
    manifest = Manifest.read(fp8_export)
    counts = check_graph(fp8_export / "model.onnx", manifest.spec)  # the ONNX checker, the spec, no float64
    layers = load_config(CFG).model.num_layers
    assert counts["QuantizeLinear"] == layers * len(FP8_LINEARS)  # one per FP8 GEMM input
    assert counts["DequantizeLinear"] == 2 * layers * len(FP8_LINEARS)  # its input and its weight
    assert not any(op.startswith("wan_trt::") for op in counts)  # standard ONNX only
    graph = load_structure(fp8_export / "model.onnx").graph
    fp8_weights = [t for t in graph.initializer if t.data_type == onnx.TensorProto.FLOAT8E4M3FN]
    assert len(fp8_weights) == layers * len(FP8_LINEARS)
    assert graph.input[0].type.tensor_type.elem_type == onnx.TensorProto.BFLOAT16


def test_fp8_export_records_the_weights_the_references_hold(fp8_export):
    """The check rebuilds the bf16 PyTorch model and must find the export's weights in it."""
    manifest = Manifest.read(fp8_export)
    verify_weights(manifest, reference_model(manifest, manifest.spec.dtype, "cpu"))


def test_an_fp8_engine_key_records_which_gemms_take_fp8(fp8_export, monkeypatch):
    """The weights' hash is taken before quantization: the FP8 scheme must be in the key itself."""
    import wan_trt.engines.artifact as artifact
    manifest = Manifest.read(fp8_export)
    before = artifact.engine_key(manifest, "aoti", "cuda")
    monkeypatch.setattr(artifact, "FP8_SCHEME", {**artifact.FP8_SCHEME, "linears": ("ffn.0", "ffn.2")})
    assert artifact.engine_key(manifest, "aoti", "cuda") != before


def test_fp8_linear_graph_runs_on_onnxruntime_as_in_pytorch(tmp_path):
    """The Q/DQ translation computes what the PyTorch op does (fp32 I/O: ONNX Runtime's CPU runs it)."""
    ort = pytest.importorskip("onnxruntime")
    torch.manual_seed(0)
    linear = Fp8Linear(torch.nn.Linear(96, 40)).eval()
    x = torch.randn(2, 7, 96)
    with torch.no_grad():
        expected = linear(x)
        program = torch.onnx.export(linear, (x,), dynamo=True, opset_version=23,
                                    custom_translation_table=translation_table(), verbose=False)
    program.save(str(tmp_path / "linear.onnx"))
    onnx.checker.check_model(onnx.load(str(tmp_path / "linear.onnx")), full_check=True)
    session = ort.InferenceSession(str(tmp_path / "linear.onnx"), providers=["CPUExecutionProvider"])
    (got,) = session.run(None, {session.get_inputs()[0].name: x.numpy()})
    np.testing.assert_allclose(got, expected.numpy(), atol=1e-5 * float(expected.abs().max()), rtol=0)


def test_fp8_is_refused_where_it_has_no_meaning(fp8_export, tmp_path):
    cfg = load_config(CFG)
    with pytest.raises(WanTrtError, match="opset 21 or later"):
        export_transformer(cfg, tmp_path / "o18", "fp8", opset=18)
    with pytest.raises(WanTrtError, match="video decoder has no fp8 graph"):
        export_decoder(cfg, tmp_path / "dec", "fp8")
    with pytest.raises(WanTrtError, match="export and build an engine"):
        run_stream(cfg, StreamOptions(blocks=1, precision="fp8", device="cpu"))
    with pytest.raises(WanTrtError, match="FP8 tensor cores"):
        build_aoti(fp8_export, device="cpu", ops="native")
    manifest = Manifest.read(fp8_export)
    with pytest.raises(WanTrtError, match="fp8 graph with bf16 I/O"):
        OnnxRuntimeRunner(fp8_export / "model.onnx", manifest.spec, "cpu")
    assert not (tmp_path / "o18").exists() and not (tmp_path / "dec").exists()
