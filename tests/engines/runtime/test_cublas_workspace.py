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
