"""Shared fixtures: the small configs (one per upstream shape) and their seeded models."""
from __future__ import annotations

import os

import torch

# Without a GPU, Triton kernels run through Triton's interpreter on CPU tensors. Set before any
# kernel module is imported (tests/plugins/*); its bf16 tl.dot is wrong, so the kernels that use
# it (window attention) are checked in bf16 on the GPU (scripts/bench_kernels.py) instead; the
# others are checked in bf16 here too.
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest  # noqa: E402

from wan_trt.config_load import load_config
from wan_trt.engines.backends.aoti import build_aoti
from wan_trt.engines.build import BuildOptions, build_engine
from wan_trt.export.decoder import export_decoder
from wan_trt.export.transformer import export_transformer
from wan_trt.model import build_model

SMALL = ["universal-small", "gta_drive-small", "templerun-small"]
FULL = ["universal", "gta_drive", "templerun"]


@pytest.fixture(params=SMALL)
def small_cfg(request):
    return load_config(request.param)


@pytest.fixture
def small_model(small_cfg):
    return build_model(small_cfg, torch.float32, "cpu", seed=1)


def assert_close(actual: torch.Tensor, expected: torch.Tensor, atol: float, rtol: float = 0.0, what: str = ""):
    """allclose that says where and by how much it missed."""
    actual, expected = actual.double(), expected.double()
    diff = (actual - expected).abs()
    bad = diff > atol + rtol * expected.abs()
    if bad.any():
        idx = tuple(int(i) for i in torch.nonzero(bad)[0])
        raise AssertionError(
            f"{what}: {int(bad.sum())}/{bad.numel()} elements off; max abs diff {float(diff.max()):.3e} "
            f"(atol {atol:g}, rtol {rtol:g}); first at {idx}: {float(actual[idx]):.6g} vs {float(expected[idx]):.6g}")


def edited_graph(directory, edit):
    """The export in ``directory`` with its graph changed in place by ``edit(model)`` (external weights left where
    they are) and its manifest's record of the graph rewritten to match: only the structural checks stand between
    it and a pass."""
    import json

    import onnx
    from wan_trt.digest import file_digest
    graph = directory / "model.onnx"
    model = onnx.load(str(graph), load_external_data=False)
    edit(model)
    onnx.save(model, str(graph))
    manifest = json.loads((directory / "manifest.json").read_text())
    manifest["files"]["model.onnx"] = file_digest(graph)
    (directory / "manifest.json").write_text(json.dumps(manifest, indent=2))
    return directory


def package_stand_in(engine, to, device: str | None = None, fused_kernel: str | None = None):
    """A copy ``to`` of the CPU package ``engine`` and its metadata standing in for a package this machine cannot
    build (a CUDA one, one with the fused kernels): its AOTInductor device record set to ``device``, a source file
    naming ``fused_kernel`` added, and the metadata saying so (device, ops plugins) with the new file's digest, as a
    build writes it."""
    import json
    import zipfile
    from pathlib import Path

    from wan_trt.digest import file_digest
    engine, to = Path(engine), Path(to)
    with zipfile.ZipFile(engine) as src, zipfile.ZipFile(to, "w") as dst:
        for item in src.infolist():
            data = src.read(item)
            if device is not None and item.filename.endswith("_metadata.json"):
                data = json.dumps({**json.loads(data), "AOTI_DEVICE_KEY": device}).encode()
            dst.writestr(item, data)
        if fused_kernel is not None:
            folder = src.namelist()[0].split("/", 1)[0]
            dst.writestr(f"{folder}/data/aotinductor/model/stand_in.py", f"# {fused_kernel}\n")
    meta = json.loads(Path(f"{engine}.json").read_text())
    meta |= {"engine_file": file_digest(to)} | ({"device": device} if device else {}) | (
        {"ops": "plugins"} if fused_kernel else {})
    Path(f"{to}.json").write_text(json.dumps(meta))
    return to


def attention_segments(gen: torch.Generator, batch: int, lq: int, n_cur: int, n_prev: int, heads: int,
                       head_dim: int, valid: int, dtype: torch.dtype, device: str):
    """Random inputs of the attentions over [previous ; current] keys: q [B, lq, H, D], k/v_prev
    [B, n_prev, H, D], k/v_cur [B, n_cur, H, D] (drawn q, k_cur, v_cur, k_prev, v_prev) and
    ``valid_frames``, in the kernels' argument order."""
    def rand(n):
        return torch.randn(batch, n, heads, head_dim, generator=gen).to(device, dtype)
    q, k_cur, v_cur, k_prev, v_prev = rand(lq), rand(n_cur), rand(n_cur), rand(n_prev), rand(n_prev)
    return q, k_prev, v_prev, k_cur, v_cur, torch.tensor([valid], dtype=torch.int32, device=device)


@pytest.fixture(scope="session")
def exports(tmp_path_factory):
    """fp32 exports of the three small shapes (opset 23) and one opset-18 export, shared by the test modules
    that only read them (export checks, the backend registry's coverage)."""
    root = tmp_path_factory.mktemp("exports")
    out = {name: export_transformer(load_config(name), root / name, "fp32", seed=3) and root / name for name in SMALL}
    out["opset18"] = root / "opset18"
    export_transformer(load_config("universal-small"), out["opset18"], "fp32", seed=3, opset=18)
    return out


@pytest.fixture(scope="session")
def aoti(tmp_path_factory):
    """universal-small fp32 export (no ONNX graph: the package does not need one) and its CPU
    AOTInductor package (built once: ~1 min), shared by the AOTInductor and C++ runtime tests."""
    root = tmp_path_factory.mktemp("aoti")
    export_transformer(load_config("universal-small"), root / "export", "fp32", seed=2, onnx=False)
    return root / "export", build_aoti(root / "export", device="cpu")


@pytest.fixture(scope="session")
def wan_stream(tmp_path_factory):
    """The C++ runtime's wan_stream executable and its test drivers beside it, built once for every test module
    that runs them (~40 s on two cores)."""
    from wan_trt.engines.runtime.cpp import build_cpp
    return build_cpp(tmp_path_factory.mktemp("cpp") / "build", tests=True)


@pytest.fixture(scope="session")
def plain_export(tmp_path_factory):
    """universal-small fp32 export without an ONNX graph (seconds), seed 2. Read-only: a test that
    changes an export copies this one first."""
    out = tmp_path_factory.mktemp("plain") / "export"
    export_transformer(load_config("universal-small"), out, "fp32", seed=2, onnx=False)
    return out


@pytest.fixture(scope="session")
def decoder_export(tmp_path_factory):
    """fp32 ONNX export of universal-small's decoder (both graphs), seed 4. Read-only."""
    out = tmp_path_factory.mktemp("decoder") / "dec"
    export_decoder(load_config("universal-small"), out, "fp32", seed=4)
    return out


@pytest.fixture(scope="session")
def decoder_aoti(decoder_export):
    """The CPU AOTInductor engine pair of ``decoder_export`` (built once: ~40 s); the steady graph's engine."""
    return build_engine(str(decoder_export), None, BuildOptions(backend="aoti", precision="fp32", device="cpu"))


@pytest.fixture(scope="session")
def tiny_decoder_export(tmp_path_factory):
    """fp32 ONNX export of universal-small's tiny decoder (both graphs), seed 6. Read-only."""
    out = tmp_path_factory.mktemp("tiny_decoder") / "dec"
    export_decoder(load_config("universal-small"), out, "fp32", seed=6, kind="tiny-decoder")
    return out


@pytest.fixture(scope="session")
def tiny_decoder_aoti(tiny_decoder_export):
    """The CPU AOTInductor engine pair of ``tiny_decoder_export`` (built once: ~45 s); the steady graph's engine."""
    return build_engine(str(tiny_decoder_export), None, BuildOptions(backend="aoti", precision="fp32", device="cpu"))
