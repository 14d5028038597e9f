"""An fp32 graph computes as fp32 wherever it runs, not only in a check: PyTorch lets cuDNN's fp32 convolutions round
their operands to TF32 by default (and a user may let the matmuls do so), so a stream or bench of an fp32 engine ran
other arithmetic than its check had judged. Every runner of an fp32 graph, the bench's reference row and the C++
runner compute under :func:`fp32_as_fp32` and give the caller's settings back."""
import subprocess

import pytest
import torch

from wan_trt.engines.backends.aoti import AotiRunner
from wan_trt.engines.backends.torch import TorchRunner
from wan_trt.engines.bench import Bench
from wan_trt.export.manifest import Manifest, reference_model

TF32 = (True, "high")  # a user's settings that let convolutions and matmuls round fp32 to TF32
FP32 = (False, "highest")


def _settings() -> tuple[bool, str]:
    return torch.backends.cudnn.allow_tf32, torch.get_float32_matmul_precision()


@pytest.fixture
def user_tf32():
    """The caller's process with TF32 allowed everywhere, as before the test after it."""
    before = _settings()
    torch.backends.cudnn.allow_tf32 = True
    torch.set_float32_matmul_precision("high")
    yield
    torch.backends.cudnn.allow_tf32 = before[0]
    torch.set_float32_matmul_precision(before[1])


def _seen_by(module: torch.nn.Module) -> list:
    seen = []
    module.register_forward_pre_hook(lambda *_: seen.append(_settings()))
    return seen


@pytest.mark.parametrize("precision, expected", [("fp32", FP32), ("bf16", TF32)])
def test_a_torch_runner_of_an_fp32_graph_computes_fp32_as_fp32(plain_export, user_tf32, precision, expected):
    """Only an fp32 graph changes the settings (a bf16 one has no TF32 path to close), for its call only."""
    manifest = Manifest.read(plain_export)
    spec = manifest.spec if precision == "fp32" else type(manifest.spec).from_config(manifest.spec.config, precision)
    model = reference_model(manifest, spec.dtype, "cpu")
    seen = _seen_by(model)
    runner = TorchRunner(model, spec)
    with runner:
        runner.infer(spec.sample_inputs(device="cpu"))
    assert seen and set(seen) == {expected}, seen
    assert _settings() == TF32


def test_an_aoti_engine_of_an_fp32_graph_runs_fp32_as_fp32(aoti, user_tf32):
    """The package's own call (the real engine) is observed through the runner's loaded package."""
    export_dir, engine = aoti
    runner = AotiRunner(engine, Manifest.read(export_dir))
    seen = []
    with runner:
        package = runner.compiled

        def observed(*args):
            seen.append(_settings())
            return package(*args)
        runner.compiled = observed
        outputs = runner.infer(runner.spec.sample_inputs(device="cpu"))
    assert seen == [FP32] and "flow" in outputs
    assert _settings() == TF32


def test_the_bench_reference_row_of_an_fp32_export_computes_fp32_as_fp32(plain_export, user_tf32):
    bench = Bench(plain_export, "cpu", {})
    seen = _seen_by(bench.model())
    bench.run("reference-eager", 2)
    assert seen and set(seen) == {FP32}, set(seen)
    assert _settings() == TF32


def test_the_cpp_runner_computes_fp32_as_fp32(wan_stream):
    """engines/cpp/tests/arithmetic.cpp: Fp32AsFp32, which AotiRunner::infer holds for an fp32 engine."""
    run = subprocess.run([str(wan_stream.parent / "arithmetic")], capture_output=True, text=True)
    assert run.returncode == 0 and run.stdout.strip() == "ok", run.stdout + run.stderr[-2000:]


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="TF32 is a CUDA arithmetic: needs a CUDA device")
def test_an_fp32_cuda_engine_streamed_under_tf32_settings_computes_ieee_fp32(plain_export, tmp_path, user_tf32):
    """On a GPU, with the caller's settings letting cuDNN and cuBLAS round fp32 to TF32: the engine's own call made so
    is far from the IEEE fp32 model (the control: what a stream of it computed before), the runner's call is not."""
    from wan_trt.engines.backends.aoti import build_aoti
    from wan_trt.engines.runtime.arithmetic import fp32_as_fp32
    from wan_trt.validate.metrics import error_stats
    manifest = Manifest.read(plain_export)
    engine = build_aoti(plain_export, tmp_path / "engine.pt2", device="cuda")
    feeds = manifest.spec.sample_inputs(device="cuda")
    with fp32_as_fp32():
        expected = TorchRunner(reference_model(manifest, torch.float32, "cuda"), manifest.spec).infer(feeds)["flow"]
    runner = AotiRunner(engine, manifest)
    with runner:
        flow = runner.infer(feeds)["flow"]
        assert _settings() == TF32
        tf32_flow = runner.compiled(*(feeds[n] for n in manifest.spec.input_names))[0]  # outside the runner's setting
    ieee, tf32 = (error_stats(f, expected).rel_l2 for f in (flow, tf32_flow))
    assert tf32 > 1e-4, f"the control computed as fp32 ({tf32:.2e}): these settings made no TF32 here"
    assert ieee < 1e-5, f"the runner's call is {ieee:.2e} off fp32 (TF32's: {tf32:.2e})"
