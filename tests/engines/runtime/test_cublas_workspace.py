"""The engines' GEMMs run without a cuBLASLt workspace unless the user chose one (see the module)."""
from __future__ import annotations

import os

import pytest
from click.testing import CliRunner

from wan_trt.cli import main
from wan_trt.config_load import load_config
from wan_trt.engines.backends.torch import TorchRunner
from wan_trt.engines.runtime.cublas_workspace import VARIABLE, prefer_workspace_free_gemms
from wan_trt.engines.runtime.session import StreamingSession
from wan_trt.model import build_model
from wan_trt.spec import PassSpec


@pytest.fixture(autouse=True)
def restored():
    """Each test starts with the variable unset and leaves the environment as it found it."""
    before = os.environ.pop(VARIABLE, None)
    yield
    os.environ.pop(VARIABLE, None)
    if before is not None:
        os.environ[VARIABLE] = before


def test_none_is_asked_for_unless_the_user_set_a_size():
    assert prefer_workspace_free_gemms() == "0" and os.environ[VARIABLE] == "0"
    os.environ[VARIABLE] = "4096"
    assert prefer_workspace_free_gemms() == "4096" and os.environ[VARIABLE] == "4096"


def test_the_command_line_asks_before_its_command_runs(monkeypatch):
    import wan_trt.config_load
    seen = []
    real = wan_trt.config_load.preset_names

    def recording(*args, **kwargs):  # the command's library call: what the environment holds when it runs
        seen.append(os.environ.get(VARIABLE))
        return real(*args, **kwargs)
    monkeypatch.setattr(wan_trt.config_load, "preset_names", recording)
    result = CliRunner().invoke(main, ["info", "--list"])
    assert result.exit_code == 0, result.output
    assert seen == ["0"]


@pytest.mark.parametrize("user", [None, "2048"])
def test_a_session_asks_when_it_is_made_and_keeps_a_users_size(user):
    if user is not None:
        os.environ[VARIABLE] = user
    cfg = load_config("universal-small")
    StreamingSession(TorchRunner(build_model(cfg), PassSpec.from_config(cfg, "fp32")))
    assert os.environ[VARIABLE] == (user or "0")


class Stop(Exception):
    pass


def _record_then_stop(seen):
    def stop(*args, **kwargs):
        seen.append(os.environ.get(VARIABLE))
        raise Stop
    return stop


@pytest.mark.parametrize("entry", ["run_bench", "check_engine", "compare_stream"])
def test_library_entries_that_run_gemms_before_a_session_ask_first(entry, monkeypatch, tmp_path):
    """bench's torch rows, check's references and the stream comparison's reference run GEMMs before any
    session is made: each asks before its first step (recorded there, then stopped)."""
    import wan_trt.engines.bench as bench
    import wan_trt.validate.check as check
    import wan_trt.validate.stream as stream
    seen = []
    if entry == "run_bench":
        monkeypatch.setattr(bench, "check_device", _record_then_stop(seen))
        call = lambda: bench.run_bench(tmp_path, bench.BenchOptions())  # noqa: E731
    elif entry == "check_engine":
        monkeypatch.setattr(check.EngineMetadata, "read", _record_then_stop(seen))
        call = lambda: check.check_engine(tmp_path / "engine.pt2")  # noqa: E731
    else:
        monkeypatch.setattr(stream, "synthetic_stream", _record_then_stop(seen))
        cfg = load_config("universal-small")
        runner = TorchRunner(build_model(cfg), PassSpec.from_config(cfg, "fp32"))
        call = lambda: stream.compare_stream(None, runner, 1)  # noqa: E731
    with pytest.raises(Stop):
        call()
    assert seen == ["0"]


# ---- on a GPU: the setting reaches cuBLASLt ----------------------------------------------------------------

GPU_CHILD = r"""
import json, sys
import torch
from torch.profiler import ProfilerActivity, profile
from wan_trt.engines.runtime.cublas_workspace import prefer_workspace_free_gemms
from wan_trt.model.fp8 import Fp8Linear, quantize_rows, reference_fp8_linear

prefer_workspace_free_gemms()  # before this process's first GEMM, as wan-trt and the sessions ask
torch.manual_seed(0)
h = torch.randn(2640, 1536, device="cuda", dtype=torch.bfloat16)  # a universal block's tokens
up = torch.nn.Linear(1536, 8960, device="cuda", dtype=torch.bfloat16)  # the FFN's up-projection
gelu = lambda: torch._addmm_activation(up.bias, h, up.weight.t(), use_gelu=True)  # the engines' GELU epilogue
for _ in range(3):
    gelu()
torch.cuda.synchronize()
with profile(activities=[ProfilerActivity.CUDA]) as prof:
    for _ in range(4):
        gelu()
    torch.cuda.synchronize()
names = [e.name for e in prof.events() if e.device_type.name == "CUDA"]
fp8 = {}  # the fp8 engines' FP8 GEMMs (cuBLASLt too), each against the fp32 reference
for k, n in ((1536, 1536), (1536, 8960), (8960, 1536)):
    linear = Fp8Linear(torch.nn.Linear(k, n, device="cuda", dtype=torch.bfloat16))
    rows = quantize_rows(torch.randn(2640, k, device="cuda", dtype=torch.bfloat16))
    got = linear(rows).float()
    want = reference_fp8_linear(rows.data, rows.scale, linear.weight, linear.weight_scale, linear.bias,
                                torch.float32)
    fp8[f"{k}x{n}"] = float((got - want).norm() / want.norm())
print(json.dumps({"memsets": sum("memset" in n.lower() for n in names),
                  "gemms": sorted({n for n in names if "memset" not in n.lower()}), "fp8_rel_l2": fp8}))
"""


def _gpu_child(workspace: str | None) -> dict:
    """Run GPU_CHILD in a fresh process (the variable is read once per process) with the variable unset
    (None: the child's own call sets it) or set to ``workspace`` KiB."""
    import json
    import subprocess
    import sys
    env = {k: v for k, v in os.environ.items() if k != VARIABLE}
    if workspace is not None:
        env[VARIABLE] = workspace
    run = subprocess.run([sys.executable, "-c", GPU_CHILD], env=env, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]
    return json.loads(run.stdout.strip().splitlines()[-1])


@pytest.mark.skipif(not __import__("torch").cuda.is_available(), reason="cuBLASLt runs on a CUDA GPU")
def test_on_a_gpu_the_setting_made_in_the_process_reaches_cublaslt():
    """Set by the process itself before its first GEMM (not in the environment it started with), the
    FFN's GELU-epilogue GEMM runs with no memset; given 1 MiB, the same GEMM runs a kernel that needs one
    (the control: proof this profile sees them). The fp8 engines' FP8 GEMMs, cuBLASLt's too, still run
    without a workspace and equal their fp32 reference."""
    own, control = _gpu_child(None), _gpu_child("1024")
    if control["memsets"] == 0:
        pytest.skip(f"this GPU's cuBLASLt runs the GELU GEMM without a workspace memset either way: "
                    f"{control['gemms']}")
    assert own["memsets"] == 0, own
    assert own["gemms"] != control["gemms"], (own, control)
    assert all(err < 0.02 for err in own["fp8_rel_l2"].values()), own
