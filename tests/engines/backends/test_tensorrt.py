"""TensorRT build / inspect / run. Without TensorRT the build must stop with a clear message;
with it (TensorRT 10.9+ and a GPU) the engine is built, inspected and checked for real."""
import importlib.util

import pytest
from click.testing import CliRunner

from wan_trt.cli import main
from wan_trt.config_load import load_config
from wan_trt.errors import WanTrtError
from wan_trt.export.transformer import export_transformer

HAS_TRT = importlib.util.find_spec("tensorrt") is not None


@pytest.fixture(scope="module")
def small_export(tmp_path_factory):
    path = tmp_path_factory.mktemp("trt") / "export"
    export_transformer(load_config("universal-small"), path, "bf16", seed=1)
    return path


@pytest.mark.skipif(HAS_TRT, reason="TensorRT is installed here: the missing-TensorRT message is not reachable")
def test_build_without_tensorrt_says_what_to_install(small_export):
    from wan_trt.engines.backends.tensorrt import build_tensorrt
    with pytest.raises(WanTrtError, match="pip install tensorrt"):
        build_tensorrt(small_export)
    res = CliRunner().invoke(main, ["build", str(small_export)])
    assert res.exit_code == 1 and "TensorRT is not installed" in res.output


def test_bad_build_flags_fail_before_tensorrt(small_export, tmp_path):
    res = CliRunner().invoke(main, ["build", str(small_export), "--fp16"])
    assert res.exit_code == 1 and "holds a bf16 graph but --fp16" in res.output
    res = CliRunner().invoke(main, ["build", str(small_export), "--timing-cache", str(tmp_path / "no/such/cache")])
    assert res.exit_code == 1 and "--timing-cache" in res.output


def test_weak_typing_is_refused_under_tensorrt_11_before_its_flags_are_set():
    """TensorRT 11 removed weak typing with BuilderFlag.BF16 / FP16 / FP8 / OBEY_PRECISION_CONSTRAINTS. The build
    looked those flags up before its version check, so --weak-typing under TensorRT 11 ended in an AttributeError;
    it is now refused first, by version, with what to do."""
    from wan_trt.engines.backends.tensorrt import check_weak_typing
    for version in ("11.0.0.114", "11.1.0", "12.0.0"):
        with pytest.raises(WanTrtError, match="--weak-typing: TensorRT .* strongly typed networks only"):
            check_weak_typing(version, True)
        check_weak_typing(version, False)
    for version in ("10.9.0.34", "10.16.1"):
        check_weak_typing(version, True)


def test_a_graph_with_ops_the_parser_does_not_read_is_refused_by_version(small_export, tmp_path):
    """The default (opset 23) graph has Attention and RMSNormalization nodes, which TensorRT's ONNX parser reads
    from 10.14 and 10.15 on; the build accepted TensorRT 10.9+ and left the parser to fail. It now says to export
    with --opset 18 (decomposed) under an older TensorRT, whose graph it accepts."""
    from wan_trt.engines.backends.tensorrt import check_parser_ops
    from wan_trt.export.manifest import Manifest
    counts = Manifest.read(small_export).op_counts
    assert counts.get("Attention") and counts.get("RMSNormalization")
    for version in ("10.9.0.34", "10.14.1"):
        with pytest.raises(WanTrtError, match=r"RMSNormalization from 10\.15\).*--opset 18"):
            check_parser_ops(version, counts)
    for version in ("10.15.1", "11.0.0"):
        check_parser_ops(version, counts)
    export_transformer(load_config("universal-small"), tmp_path / "o18", "bf16", seed=1, opset=18)
    check_parser_ops("10.9.0", Manifest.read(tmp_path / "o18").op_counts)


def test_an_export_without_an_onnx_graph_is_refused_before_tensorrt(plain_export):
    """A --no-onnx export has nothing to parse: said before TensorRT is looked for (without it, the build asked the
    user to install TensorRT, which would then fail on the missing graph)."""
    res = CliRunner().invoke(main, ["build", str(plain_export), "--fp32"])
    assert res.exit_code == 1 and "--no-onnx" in res.output and "TensorRT is not installed" not in res.output, \
        res.output


@pytest.mark.tensorrt
@pytest.mark.skipif(not HAS_TRT, reason="TensorRT is not installed: pip install tensorrt (10.9+; NVIDIA package index, CUDA GPU)")
def test_build_inspect_and_check_tensorrt(small_export):
    from wan_trt.engines.backends.tensorrt import build_tensorrt, inspect_tensorrt
    from wan_trt.validate.check import CheckOptions, check_engine
    engine = build_tensorrt(small_export)
    info = inspect_tensorrt(engine)
    assert info["counts"]["layers"] > 0
    assert check_engine(engine, CheckOptions(blocks=8)).ok


@pytest.mark.tensorrt
@pytest.mark.skipif(not HAS_TRT, reason="TensorRT is not installed: pip install tensorrt (10.9+; NVIDIA package index, CUDA GPU)")
def test_bench_runs_the_tensorrt_engine(small_export, tmp_path):
    from wan_trt.engines.backends.tensorrt import build_tensorrt
    engine = build_tensorrt(small_export)
    res = CliRunner().invoke(main, ["bench", str(small_export), "--device", "cuda", "--blocks", "2",
                                    "--trt-engine", str(engine), "--backends", "tensorrt"])
    assert res.exit_code == 0 and "tensorrt" in res.output and "FAILED" not in res.output, res.output


@pytest.mark.parametrize("which", ["manifest", "sample_inputs", "link"])
def test_a_timing_cache_that_is_a_file_of_the_export_or_a_link_is_refused(plain_export, tmp_path, which):
    """--timing-cache is read as a cache and then written over: pointed at the export's own files (or through a
    link, at anything) the build would replace them with a timing cache. Refused before TensorRT is needed."""
    from wan_trt.engines.backends.tensorrt import build_tensorrt
    cache = {"manifest": plain_export / "manifest.json", "sample_inputs": plain_export / "sample_inputs.safetensors",
             "link": tmp_path / "cache.bin"}[which]
    if which == "link":
        cache.symlink_to(plain_export / "manifest.json")
    before = (plain_export / "manifest.json").read_bytes()
    with pytest.raises(WanTrtError, match=r"--timing-cache .*(a file of the export|symbolic link)"):
        build_tensorrt(plain_export, timing_cache=cache)
    assert (plain_export / "manifest.json").read_bytes() == before


def test_a_plan_replaced_after_its_verification_is_not_read(aoti, tmp_path, monkeypatch):
    """The TensorRT runner (and Polygraphy's, in a check) read the plan from disk again when they started, minutes
    after its sha256 was verified: a build that installed another engine there meanwhile had it run under the
    verified sha256. Both read it through the runner, which refuses a file replaced since. (The plan here is any
    file with its metadata: reading it needs neither TensorRT nor, until it runs, a GPU.)"""
    import json
    import os
    import shutil

    from wan_trt.engines.backends.tensorrt import TensorRTRunner
    from wan_trt.export.manifest import Manifest
    export_dir, package = aoti
    plan = tmp_path / "engine.plan"
    shutil.copy(package, plan)
    meta = json.loads(package.with_name(package.name + ".json").read_text())
    plan.with_name(plan.name + ".json").write_text(json.dumps({**meta, "backend": "tensorrt", "device": "cuda"}))
    import torch
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)  # the runner is made for CUDA; nothing runs here
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    runner = TensorRTRunner(plan, Manifest.read(export_dir))
    assert runner.engine_bytes() == package.read_bytes()
    other = tmp_path / "other.plan"
    shutil.copy(plan, other)
    os.replace(other, plan)  # what install_engine does: a new file renamed over the old (same bytes here)
    with pytest.raises(WanTrtError, match="replaced or rewritten since it was verified"):
        runner.engine_bytes()


def test_a_timing_cache_that_is_no_regular_file_is_refused(plain_export, tmp_path):
    """A FIFO (or a device) named as --timing-cache was read as a cache: the build waited on it for ever, and would
    then have written its cache into it. Refused before TensorRT is needed."""
    import os
    from wan_trt.engines.backends.tensorrt import build_tensorrt
    fifo = tmp_path / "cache.fifo"
    os.mkfifo(fifo)
    with pytest.raises(WanTrtError, match=r"--timing-cache .*no regular file"):
        build_tensorrt(plain_export, timing_cache=fifo)


@pytest.mark.tensorrt
@pytest.mark.skipif(not HAS_TRT, reason="TensorRT is not installed: pip install tensorrt (10.9+; NVIDIA package index, CUDA GPU)")
def test_a_timing_cache_file_tensorrt_does_not_read_is_refused_not_replaced(small_export, tmp_path):
    """The build read --timing-cache as a cache and then wrote its own over it: a file of anything else named there
    (a checkpoint, notes) was replaced. A file TensorRT does not read as a timing cache is now refused; a cache the
    build wrote is read and updated."""
    from wan_trt.engines.backends.tensorrt import build_tensorrt
    notes = tmp_path / "notes.txt"
    notes.write_text("not a timing cache\n" * 100)
    with pytest.raises(WanTrtError, match="no timing cache TensorRT .* reads"):
        build_tensorrt(small_export, out=tmp_path / "a.plan", timing_cache=notes)
    assert notes.read_text() == "not a timing cache\n" * 100
    cache = tmp_path / "timing.cache"
    build_tensorrt(small_export, out=tmp_path / "b.plan", timing_cache=cache)
    assert cache.stat().st_size > 0
    build_tensorrt(small_export, out=tmp_path / "c.plan", timing_cache=cache)  # its own cache: read, not refused


def test_an_engine_whose_io_shapes_or_dtypes_differ_from_the_spec_is_named(plain_export):
    """The TensorRT runners compared an engine's I/O by name only, then bound buffers allocated by the spec: an engine
    of another shape or dtype would read or write past them. Shapes and dtypes are compared too (the engine's as
    TensorRT reports them; this test gives them as the runner hands them over, no TensorRT here)."""
    from wan_trt.engines.backends.tensorrt import io_mismatches
    from wan_trt.export.manifest import Manifest
    spec = Manifest.read(plain_export).spec
    shapes = {t.name: tuple(t.shape) for t in (*spec.inputs, *spec.outputs)}
    dtypes = {t.name: t.torch_dtype for t in (*spec.inputs, *spec.outputs)}
    assert io_mismatches(spec, shapes, dtypes) == []
    first, last = spec.inputs[0], spec.outputs[-1]
    shapes[first.name] = (*first.shape[:-1], first.shape[-1] + 1)
    dtypes[last.name] = None  # a TensorRT type with no torch dtype (FP8, say)
    assert io_mismatches(spec, shapes, dtypes) == [
        f"{first.name}: shape {[*first.shape[:-1], first.shape[-1] + 1]}, the spec's {list(first.shape)}",
        f"{last.name}: dtype None, the spec's {last.torch_dtype}"]
