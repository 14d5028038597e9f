"""The backend registry: every entry is exercised, and every command reads its names from it."""
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner

from wan_trt.cli import main
from wan_trt.engines.backends import (ALL_BACKENDS, BACKENDS, BUILDABLE, RunnerSources, get_backend, parse_backends,
                                     why_not)
from wan_trt.engines.bench import BenchOptions, run_bench
from wan_trt.engines.build import BuildOptions, build_engine
from wan_trt.errors import WanTrtError

ROOT = Path(__file__).resolve().parents[3]


@pytest.fixture(scope="module")
def report(exports):
    """The default set benched on this machine's CPU: what can run runs, the rest is skipped."""
    return run_bench(exports["universal-small"], BenchOptions(blocks=2, device="cpu"))


@pytest.mark.parametrize("backend", BACKENDS, ids=lambda b: b.name)
def test_every_backend_runs_here_or_is_skipped_with_its_reason(report, exports, backend):
    assert backend.name not in report["failed"], report["failed"].get(backend.name)
    if backend.name in report["backends"]:
        assert report["backends"][backend.name]["block_ms"]["mean"] > 0
        return
    sources = RunnerSources(None, "cpu", lambda ops="native": None, engines={})
    reason, expected = report["skipped"][backend.name], why_not(backend, sources)
    assert expected is not None, f"{backend.name} can run here, yet was skipped: {reason}"
    assert reason == expected, reason
    # what cannot run here is run by the test the entry names (on a machine that has what it needs)
    test = (ROOT / backend.test).read_text()
    assert f'"{backend.name}"' in test or f"{backend.name}," in test or backend.engine_flag in test, backend.test


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="torch-compile-plugins needs a CUDA device")
def test_cuda_only_torch_backend_runs_on_a_gpu(exports):
    report = run_bench(exports["universal-small"], BenchOptions(backends=("torch-compile-plugins",), blocks=2,
                                                               device="cuda"))
    assert set(report["backends"]) == {"torch-compile-plugins"} and not report["failed"], report["failed"]


def test_every_backend_has_a_test_file_that_names_it():
    for backend in BACKENDS:
        assert (ROOT / backend.test).is_file(), f"{backend.name}: {backend.test} does not exist"


def test_the_cli_choices_are_the_registry(tmp_path):
    bench_help = CliRunner().invoke(main, ["bench", "--help"], terminal_width=1000).output
    assert all(name in bench_help for name in ALL_BACKENDS), bench_help
    build_help = CliRunner().invoke(main, ["build", "--help"], terminal_width=1000).output
    assert f"[{'|'.join(BUILDABLE)}]" in build_help, build_help


def test_build_refuses_a_backend_that_builds_no_engine():
    with pytest.raises(WanTrtError, match="--backend onnxruntime: not an engine that `wan-trt build` makes; "
                                          "expected one of aoti, tensorrt"):
        build_engine(None, "universal-small", BuildOptions(backend="onnxruntime"))
    with pytest.raises(WanTrtError, match="--backend tensorrtt: not an engine that `wan-trt build` makes"):
        build_engine(None, "universal-small", BuildOptions(backend="tensorrtt"))


@pytest.mark.parametrize("backend", BUILDABLE)
@pytest.mark.parametrize("name", ["engine.bin", "engine", "engine.pt2"])
def test_every_buildable_backend_refuses_an_out_it_does_not_write_before_any_work(tmp_path, monkeypatch, backend,
                                                                                  name):
    """Each building entry declares the name its engine file takes, and `build --out` is held to it before any
    export or trace: `build --config C --backend tensorrt --out engine.pt2` exported C first (minutes at full
    size), only aoti's .pt2 was checked up front. A TensorRT plan may take any name but an AOTInductor package's."""
    entry = get_backend(backend)
    if name.endswith(entry.engine_suffix) or (entry.any_engine_name and not name.endswith(".pt2")):
        pytest.skip(f"{name} is a name --backend {backend} writes (test_the_engine_names_are_the_default_ones)")
    monkeypatch.chdir(tmp_path)
    device = [] if backend == "tensorrt" else ["--device", "cpu"]  # TensorRT refuses any device but cuda
    res = CliRunner().invoke(main, ["build", "--config", "universal-small", "--fp32", "--backend", backend, *device,
                                    "--out", str(tmp_path / name)])
    expected = (f"writes a {entry.engine_suffix} file" if not entry.any_engine_name
                else "a .pt2 file is an engine of --backend aoti")
    assert res.exit_code == 1 and res.output.startswith(f"error: --out {tmp_path / name}: ") and expected in \
        res.output and f"e.g. {tmp_path / ('engine' + entry.engine_suffix)}" in res.output, res.output
    assert not list(tmp_path.iterdir())  # no export made


def test_the_engine_names_are_the_default_ones(tmp_path):
    """`build` without --out writes the name its backend declares; a TensorRT plan may take the usual others."""
    from wan_trt.engines.artifact import default_engine_path
    from wan_trt.engines.backends import check_engine_name
    assert [default_engine_path(tmp_path, b, "cpu").suffix for b in BUILDABLE] == \
        [get_backend(b).engine_suffix for b in BUILDABLE]
    assert default_engine_path(tmp_path, "aoti", "cuda", "plugins").name == "engine_aoti_plugins_cuda.pt2"
    assert default_engine_path(tmp_path, "tensorrt", "cuda").name == "engine_tensorrt_cuda.plan"
    assert get_backend("aoti").engine_suffix == ".pt2" and get_backend("tensorrt").engine_suffix == ".plan"
    for name in ("model.plan", "model.engine", "model.trt", "model"):  # TensorRT reads any name
        check_engine_name(get_backend("tensorrt"), tmp_path / name)


def test_build_precision_and_its_alias_must_agree(tmp_path):
    res = CliRunner().invoke(main, ["build", str(tmp_path), "--precision", "fp32", "--bf16"])
    assert res.exit_code == 1 and "error: --precision fp32 and --bf16 disagree; pass one of them" in res.output


def test_profiling_the_reference_pipeline_is_refused_before_any_work(exports, tmp_path):
    out = tmp_path / "bench.json"
    res = CliRunner().invoke(main, ["bench", str(exports["universal-small"]), "--device", "cpu",
                                    "--backends", "reference-eager", "--profile", "reference-eager",
                                    "--out", str(out)])
    assert res.exit_code == 1 and "error: --profile reference-eager: the reference pipeline has no single pass" \
        in res.output, res.output
    assert not out.exists()


@pytest.mark.parametrize("profile, message", [
    ("torch-eager", "error: --profile torch-eager: a profile reads the GPU's kernel times; run it with --device cuda"),
    ("decoder", "error: --profile decoder: give the decoder engine (--decoder-engine) and its export (--decoder)"),
])
def test_profiles_that_cannot_run_are_refused_before_any_work(exports, tmp_path, profile, message):
    """A CPU run cannot profile kernels, and the decoder's profile needs its engine."""
    out = tmp_path / "bench.json"
    res = CliRunner().invoke(main, ["bench", str(exports["universal-small"]), "--device", "cpu",
                                    "--backends", "torch-eager", "--profile", profile, "--out", str(out)])
    assert res.exit_code == 1 and message in res.output, res.output
    assert not out.exists()


def test_a_backend_named_twice_is_refused():
    """`--backends aoti,aoti` ran the backend twice and reported one row (the second run's)."""
    with pytest.raises(WanTrtError, match="--backends: 'torch-eager' named twice"):
        parse_backends("torch-eager,aoti, torch-eager")
    assert parse_backends("torch-eager,aoti") == ["torch-eager", "aoti"]
    with pytest.raises(WanTrtError, match="--end-to-end: 'aoti' named twice"):
        parse_backends("aoti,aoti", "--end-to-end")


@pytest.mark.parametrize("backend", [b for b in BACKENDS if "engine" in b.requires and "tensorrt" not in b.requires],
                         ids=lambda b: b.name)  # TensorRT's own requirement is judged first
def test_a_missing_engine_is_skipped_with_the_build_that_makes_it(backend):
    """aoti-plugins without --aoti-plugins-engine said to build one with `wan-trt build DIR --backend aoti`, which
    makes a native package that its flag then refuses as built for aoti."""
    sources = RunnerSources(None, "cpu", lambda ops="native": None, engines={})
    reason = why_not(backend, sources)
    assert reason is not None and backend.engine_flag in reason, reason
    build = reason.split("`")[1]
    assert ("--ops plugins" in build) == (backend.ops == "plugins"), reason
    assert ("--backend aoti" in build) == (backend.module == "aoti"), reason
