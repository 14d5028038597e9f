"""What every runner refuses before it runs a pass: a call outside ``with runner:`` where the runner loads its engine
on entering it, and feeds that are not its spec's inputs as it reads them (type, device, layout); and what it leaves."""
import tempfile

import pytest
import torch
from safetensors.torch import load_file

from wan_trt.config_load import load_config
from wan_trt.engines.backends.aoti import AotiRunner
from wan_trt.engines.backends.onnxruntime import OnnxRuntimeRunner
from wan_trt.engines.backends.torch import TorchRunner
from wan_trt.errors import WanTrtError
from wan_trt.export.manifest import Manifest, reference_model
from wan_trt.export.transformer import export_transformer


@pytest.fixture(scope="module")
def onnx_export(tmp_path_factory):
    """universal-small fp32 export with its ONNX graph, and its sample inputs."""
    out = tmp_path_factory.mktemp("runners") / "export"
    export_transformer(load_config("universal-small"), out, "fp32", seed=2)
    manifest = Manifest.read(out)
    return out, manifest, load_file(str(out / manifest.sample_inputs))


def _strided(tensor: torch.Tensor) -> torch.Tensor:
    """``tensor``'s values in a non-contiguous layout (its last two dimensions stored transposed)."""
    strided = tensor.transpose(-1, -2).contiguous().transpose(-1, -2)
    assert torch.equal(strided, tensor) and not strided.is_contiguous()
    return strided


@pytest.mark.parametrize("kind", ["onnxruntime", "aoti"])
def test_infer_outside_with_is_refused_clearly(onnx_export, aoti, kind):
    """It failed with AttributeError / "'NoneType' object is not callable": the engine is loaded on entering `with`."""
    export_dir, manifest, feeds = onnx_export
    runner = (OnnxRuntimeRunner(manifest.graph_path(export_dir), manifest.spec) if kind == "onnxruntime"
              else AotiRunner(aoti[1], Manifest.read(aoti[0])))
    with pytest.raises(WanTrtError, match=r"outside `with runner:`"):
        runner.infer(feeds)
    with runner:
        runner.infer(feeds)
    with pytest.raises(WanTrtError, match=r"outside `with runner:`"):  # released on exit
        runner.infer(feeds)


def test_a_non_contiguous_feed_is_refused_by_an_aoti_package(aoti):
    """A package reads its inputs as the contiguous tensors it was compiled for: a transposed-in-memory feed of the
    right shape and values ran and returned other outputs (rel. error ~1), with no error."""
    manifest = Manifest.read(aoti[0])
    feeds = load_file(str(aoti[0] / manifest.sample_inputs))
    with AotiRunner(aoti[1], manifest) as runner:
        with pytest.raises(WanTrtError, match=r"input 'latents'.*not contiguous"):
            runner.infer({**feeds, "latents": _strided(feeds["latents"])})


@pytest.mark.parametrize("kind", ["onnxruntime", "aoti", "torch"])
def test_a_feed_on_another_device_is_refused_naming_it(onnx_export, aoti, kind):
    """A package read the (meta) tensor's address as a CPU one: the process died of a segmentation fault."""
    export_dir, manifest, feeds = onnx_export
    if kind == "aoti":
        manifest = Manifest.read(aoti[0])
        runner = AotiRunner(aoti[1], manifest)
    elif kind == "onnxruntime":
        runner = OnnxRuntimeRunner(manifest.graph_path(export_dir), manifest.spec)
    else:
        runner = TorchRunner(reference_model(manifest, torch.float32, "cpu"), manifest.spec)
    with runner, pytest.raises(WanTrtError, match=r"input 'latents' is on meta, not cpu"):
        runner.infer({**feeds, "latents": feeds["latents"].to("meta")})


@pytest.mark.parametrize("value", [[0.0], None, 1.5])
def test_a_feed_that_is_no_tensor_is_refused_naming_it(onnx_export, value):
    """A list or None as a feed failed with AttributeError ('list' object has no attribute 'shape')."""
    export_dir, manifest, feeds = onnx_export
    with OnnxRuntimeRunner(manifest.graph_path(export_dir), manifest.spec) as runner:
        with pytest.raises(WanTrtError, match=rf"input 'latents' is a {type(value).__name__}, not a torch.Tensor"):
            runner.infer({**feeds, "latents": value})


def test_the_torch_runner_still_takes_strided_feeds(onnx_export):
    """PyTorch reads any layout: a strided feed gives the contiguous feed's outputs."""
    _, manifest, feeds = onnx_export
    runner = TorchRunner(reference_model(manifest, torch.float32, "cpu"), manifest.spec)
    plain = {k: v.clone() for k, v in runner.infer(feeds).items()}
    strided = runner.infer({**feeds, "latents": _strided(feeds["latents"])})
    assert all(torch.equal(plain[k], strided[k]) for k in plain)


def test_a_plugin_graph_leaves_no_copy_behind(tmp_path, monkeypatch):
    """ONNX Runtime runs a --ops plugins graph from a copy with its fused ops renamed for onnxruntime-extensions; every
    run left that copy (the size of the graph and its weights) in the temporary folder, never removed."""
    pytest.importorskip("onnxruntime_extensions")
    export_transformer(load_config("universal-small"), tmp_path / "export", "fp32", seed=2, ops="plugins")
    manifest = Manifest.read(tmp_path / "export")
    feeds = load_file(str(tmp_path / "export" / manifest.sample_inputs))
    scratch = tmp_path / "tmp"
    scratch.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(scratch))  # the temporary folder of this process, watched
    with OnnxRuntimeRunner(manifest.graph_path(tmp_path / "export"), manifest.spec) as runner:
        outputs = runner.infer(feeds)
    assert all(torch.isfinite(v).all() for v in outputs.values())  # it ran the graph
    assert list(scratch.iterdir()) == []
