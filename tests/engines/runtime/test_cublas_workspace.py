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


@pytest.fixture
def unset(monkeypatch):
    monkeypatch.delenv(VARIABLE, raising=False)


def test_none_is_asked_for_unless_the_user_set_a_size(unset, monkeypatch):
    assert prefer_workspace_free_gemms() == "0" and os.environ[VARIABLE] == "0"
    monkeypatch.setenv(VARIABLE, "4096")
    assert prefer_workspace_free_gemms() == "4096" and os.environ[VARIABLE] == "4096"


def test_the_command_line_asks_before_any_command_runs(unset):
    result = CliRunner().invoke(main, ["info", "--list"])
    assert result.exit_code == 0, result.output
    assert os.environ[VARIABLE] == "0"


def test_a_session_asks_when_it_is_made(unset):
    cfg = load_config("universal-small")
    StreamingSession(TorchRunner(build_model(cfg), PassSpec.from_config(cfg, "fp32")))
    assert os.environ[VARIABLE] == "0"
