import json

import pytest
from click.testing import CliRunner

from wan_trt.cli import main
from wan_trt.config_load import load_config
from wan_trt.info import flops_per_pass, model_info


@pytest.mark.parametrize("name, params", [("universal", 1.619e9), ("gta_drive", 1.619e9), ("templerun", 1.509e9)])
def test_full_size_facts(name, params):
    info = model_info(load_config(name))
    assert info["parameters"] == pytest.approx(params, rel=1e-3)
    assert info["tokens_per_frame"] == 880 and info["tokens_per_block"] == 2640


def test_universal_flops_match_the_design_budget():
    f = flops_per_pass(load_config("universal"))
    # docs/DESIGN.md section 2: ~6.6 T linear, 0.8 action, 2.6 self-attention, 0.1 cross-attention
    assert f["linear"] == pytest.approx(6.6e12, rel=0.03)
    assert f["action"] == pytest.approx(0.83e12, rel=0.05)
    assert f["self_attention"] == pytest.approx(2 * 2 * 2640 * 5280 * 1536 * 30)
    assert f["cross_attention"] == pytest.approx(0.125e12, rel=0.02)
    first = flops_per_pass(load_config("universal"), valid_frames=0)
    assert first["self_attention"] == pytest.approx(f["self_attention"] / 2)


def test_cache_sizes():
    caches = model_info(load_config("universal"))["caches"]
    assert caches["per_layer"]["self"]["upstream_rolling"] == 6 * 880 * 1536 * 2 * 2  # [1, 5280, 12, 128] k+v bf16
    assert caches["per_layer"]["mouse"]["upstream_rolling"] == 880 * 6 * 16 * 64 * 2 * 2
    assert caches["per_layer"]["keyboard"]["static_prev"] == 3 * 16 * 64 * 2 * 2


def test_cli_info_json_and_list():
    runner = CliRunner()
    res = runner.invoke(main, ["info", "--config", "templerun", "--json"])
    assert res.exit_code == 0, res.output
    data = json.loads(res.output)
    assert data["inputs"] == {"mouse": False, "keyboard": True} and data["passes_per_block"] == 5
    res = runner.invoke(main, ["info", "--list"])
    assert res.exit_code == 0 and "universal-small" in res.output.split()
    res = runner.invoke(main, ["info", "--config", "universal"])
    assert "1.619 B" in res.output and "2640" in res.output


def test_cli_user_error_exits_1_without_traceback():
    res = CliRunner().invoke(main, ["info", "--config", "does-not-exist"])
    assert res.exit_code == 1
    assert "error: --config 'does-not-exist'" in res.output and "Traceback" not in res.output


@pytest.mark.parametrize("config", ["universal-small", "universal", "no-such-preset"])
def test_list_with_a_config_is_refused(config):
    """`info --list --config X` printed the preset list and dropped --config without a word."""
    res = CliRunner().invoke(main, ["info", "--list", "--config", config, "--json"])
    assert res.exit_code == 1 and "Traceback" not in res.output, res.output
    assert res.output.startswith(f"error: --config {config}: --list lists the presets and takes no --config"), \
        res.output


def test_list_as_json_is_the_preset_names():
    res = CliRunner().invoke(main, ["info", "--list", "--json"])
    assert res.exit_code == 0 and "universal-small" in json.loads(res.output), res.output
