import json
from pathlib import Path

import pytest

from wan_trt.config_load import PRESET_DIR, load_config, preset_names
from wan_trt.errors import WanTrtError
from tests.conftest import FULL, SMALL


def test_every_preset_loads_with_upstream_numbers():
    assert set(FULL + SMALL) <= set(preset_names())
    uni, gta, tr = (load_config(n) for n in FULL)
    assert (uni.model.dim, uni.model.ffn_dim, uni.model.num_heads, uni.model.num_layers) == (1536, 8960, 12, 30)
    assert (uni.model.local_attn_size, gta.model.local_attn_size, tr.model.local_attn_size) == (6, 4, 6)
    assert uni.action_layers == tuple(range(15))
    assert (uni.model.action_config.keyboard_dim_in, gta.model.action_config.keyboard_dim_in,
            tr.model.action_config.keyboard_dim_in) == (4, 2, 7)
    assert uni.has_mouse and gta.has_mouse and not tr.has_mouse
    assert uni.tokens_per_frame == 880 and uni.tokens_per_block == 2640
    assert (uni.prev_frames, gta.prev_frames, tr.prev_frames) == (3, 1, 3)
    assert (uni.passes_per_block, tr.passes_per_block) == (4, 5)


@pytest.mark.parametrize("name", FULL)
def test_upstream_config_json_picks_the_matching_inference(tmp_path, name):
    preset = json.loads((load_config.__globals__["PRESET_DIR"] / f"{name}.json").read_text())
    path = tmp_path / name / "config.json"
    path.parent.mkdir()
    path.write_text(json.dumps(preset["model"]))  # an upstream config.json: model fields only
    cfg = load_config(path)
    assert cfg.model == load_config(name).model
    assert cfg.inference == load_config(name).inference
    assert load_config(path.parent).model == cfg.model  # a folder holding config.json works too


def _write(tmp_path, change):
    data = json.loads((load_config.__globals__["PRESET_DIR"] / "universal-small.json").read_text())
    change(data)
    path = tmp_path / "cfg.json"
    path.write_text(json.dumps(data))
    return path


@pytest.mark.parametrize("change, field", [
    (lambda d: d["model"].update(num_heads=5), "num_heads"),
    (lambda d: d["model"].update(local_attn_size=2), "local_attn_size"),
    (lambda d: d["model"].update(local_attn_size=-1), "local_attn_size"),
    (lambda d: d["model"].update(sink_size=1), "sink_size"),
    (lambda d: d["model"].update(in_dim=35), "in_dim"),
    (lambda d: d["model"].update(dimm=3), "dimm"),
    (lambda d: d["model"]["action_config"].update(blocks=[0, 9]), "action_config.blocks"),
    (lambda d: d["model"]["action_config"].update(keyboard_dim_in=0), "action_config.keyboard_dim_in"),
    (lambda d: d["model"]["action_config"].update(mouse_qk_dim_list=[4, 6, 8]), "mouse_qk_dim_list"),
    (lambda d: d["inference"].update(denoising_step_list=[333, 666]), "denoising_step_list"),
    (lambda d: d["inference"].update(latent_height=5), "latent_height"),
    (lambda d: d["model"].update(num_layers=2000), "'num_layers': expected at most 1024 layers"),
    (lambda d: d["inference"].update(latent_height=1024, latent_width=1024), "at most 65536 patches"),
    (lambda d: d["inference"].update(rope_max_frames=1024), "'inference.rope_max_frames' .*no RoPE table"),
    # read by nothing: the model always has these norms (a config without them ran another model, silently)
    (lambda d: d["model"].update(qk_norm=False), "'qk_norm': expected true"),
    (lambda d: d["model"].update(cross_attn_norm=False), "'cross_attn_norm': expected true"),
    (lambda d: d["model"]["action_config"].update(qk_norm=False), "'action_config.qk_norm': expected true"),
])
def test_bad_field_is_named(tmp_path, change, field):
    with pytest.raises(WanTrtError, match=field):
        load_config(_write(tmp_path, change))


def test_unknown_preset_and_bad_json(tmp_path):
    with pytest.raises(WanTrtError, match="neither a preset nor a file"):
        load_config("universal-tiny")
    bad = tmp_path / "x.json"
    bad.write_text("{nope")
    with pytest.raises(WanTrtError, match="not valid JSON"):
        load_config(bad)


def test_round_trip_through_dict():
    from wan_trt.config_load import config_from_dict
    for name in FULL + SMALL:
        cfg = load_config(name)
        assert config_from_dict(json.loads(json.dumps(cfg.to_dict())), name) == cfg


# ---- JSON types, completeness and sizes ----------------------------------------------------

def _upstream(tmp_path, change, preset="universal"):
    """An upstream-format config.json (model fields at the top level), edited by ``change``."""
    data = json.loads((load_config.__globals__["PRESET_DIR"] / f"{preset}.json").read_text())["model"]
    data.pop("clip_dim", None), data.pop("clip_tokens", None)
    change(data)
    path = tmp_path / "config.json"
    path.write_text(json.dumps(data))
    return path


@pytest.mark.parametrize("change, field", [
    (lambda d: d["model"]["action_config"].update(enable_mouse="false"), "action_config.enable_mouse"),
    (lambda d: d["model"]["action_config"].update(enable_keyboard=0), "action_config.enable_keyboard"),
    (lambda d: d["inference"].update(timestep_shift="5"), "inference.timestep_shift"),
    (lambda d: d["inference"].update(timestep_shift=float("nan")), "inference.timestep_shift"),
    (lambda d: d["model"].update(patch_size=2), "model.patch_size"),
    (lambda d: d["model"].update(patch_size=[1, 2.5, 2]), "model.patch_size"),
    (lambda d: d["model"].update(action_config="none"), "model.action_config"),
    (lambda d: d["model"].update(num_layers=4.0), "model.num_layers"),
    (lambda d: d["model"].update(num_layers=True), "model.num_layers"),
    (lambda d: d["model"].update(eps="1e-6"), "model.eps"),
    (lambda d: d["model"].update(model_type=2), "model.model_type"),
    (lambda d: d["model"]["action_config"].update(blocks=[0, "1"]), "action_config.blocks"),
    (lambda d: d["inference"].update(warp_denoising_step="yes"), "inference.warp_denoising_step"),
    (lambda d: d.update(inference=[]), "inference"),
])
def test_wrong_json_type_is_named(tmp_path, change, field):
    with pytest.raises(WanTrtError, match=rf"{field}': expected .*got .*cfg\.json") as err:
        load_config(_write(tmp_path, change))
    assert "fix it in" in str(err.value)


@pytest.mark.parametrize("change, field", [
    (lambda d: d.pop("num_layers"), "num_layers"),
    (lambda d: d.pop("action_config"), "action_config"),
    (lambda d: d["action_config"].pop("enable_mouse"), "action_config.enable_mouse"),
    (lambda d: d["action_config"].pop("keyboard_dim_in"), "action_config.keyboard_dim_in"),
    (lambda d: d["action_config"].pop("mouse_dim_in"), "action_config.mouse_dim_in"),  # mouse is on
])
def test_upstream_config_json_must_be_complete(tmp_path, change, field):
    with pytest.raises(WanTrtError, match=rf"missing field '{field}'.*config\.json"):
        load_config(_upstream(tmp_path, change))


def test_upstream_fields_the_constructor_defaults_may_be_left_out(tmp_path):
    """Upstream's config.json files omit patch_size, qk_norm, cross_attn_norm (and the mouse fields
    of a keyboard-only model): the constructor's defaults apply, as upstream."""
    path = _upstream(tmp_path, lambda d: [d.pop(k, None) for k in ("patch_size", "qk_norm", "cross_attn_norm")],
                     preset="templerun")
    cfg = load_config(path)
    assert cfg.model == load_config("templerun").model
    assert not cfg.has_mouse


def test_absurd_sizes_are_refused_before_any_allocation(tmp_path):
    import time
    start = time.perf_counter()
    with pytest.raises(WanTrtError, match=r"'num_layers': expected .*at most \d+"):
        load_config(_upstream(tmp_path, lambda d: d.update(num_layers=1_000_000_000)))
    assert time.perf_counter() - start < 1.0

    def huge(d):  # every field within its own bound, together ~1e12 parameters
        d.update(dim=65536, num_heads=512, ffn_dim=262144)
        d["action_config"]["img_hidden_size"] = 65536
    with pytest.raises(WanTrtError, match=r"parameters.*dim, ffn_dim, num_layers"):
        load_config(_upstream(tmp_path, huge))


@pytest.mark.parametrize("content, match", [
    (b"\x89PNG\r\n\x1a\n\x00\x00binary", "not a UTF-8 text file"),
    (b"[1, 2]", "expected a JSON object"),
    (b'"universal"', "expected a JSON object"),
])
def test_file_that_is_not_a_json_object(tmp_path, content, match):
    path = tmp_path / "weird.json"
    path.write_bytes(content)
    with pytest.raises(WanTrtError, match=rf"{match}.*weird\.json|weird\.json.*{match}"):
        load_config(path)


def test_analytic_parameter_count_matches_the_model():
    from wan_trt.sizes import parameter_count
    from wan_trt.model import count_parameters
    for name in FULL + SMALL:
        cfg = load_config(name)
        assert parameter_count(cfg) == count_parameters(cfg), name


@pytest.mark.parametrize("content, field", [
    (lambda d: d["action_config"].update(enable_mouse="false"), "action_config.enable_mouse"),
    (lambda d: d.pop("num_layers"), "num_layers"),
    (lambda d: d.update(patch_size=2), "patch_size"),
    (lambda d: d.update(num_layers=1_000_000_000), "num_layers"),
])
def test_cli_prints_one_error_line(tmp_path, content, field):
    from click.testing import CliRunner
    from wan_trt.cli import main
    result = CliRunner().invoke(main, ["info", "--config", str(_upstream(tmp_path, content))])
    assert result.exit_code == 1 and isinstance(result.exception, SystemExit)
    errors = [line for line in result.output.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and field in errors[0] and "Traceback" not in result.output


def test_cli_binary_config_file(tmp_path):
    from click.testing import CliRunner
    from wan_trt.cli import main
    path = tmp_path / "config.json"
    path.write_bytes(bytes(range(256)))
    result = CliRunner().invoke(main, ["info", "--config", str(path)])
    assert result.exit_code == 1 and isinstance(result.exception, SystemExit)
    assert f"error: --config {path}" in result.output


def _preset_with(tmp_path, edit):
    import json
    data = json.loads((Path(__file__).parents[2] / "wan_trt" / "configs" / "universal-small.json").read_text())
    edit(data)
    path = tmp_path / "cfg.json"
    path.write_text(json.dumps(data))
    return path


@pytest.mark.parametrize("edit, message", [
    (lambda d: d.update(inferenc=d.pop("inference")), "inferenc"),  # took the full-size preset's inference
    (lambda d: d.update(name="../../escaped"), "name"),  # the default --out went outside out/
    (lambda d: d.update(name=["a", "b"]), "name"),
    (lambda d: d["model"]["action_config"].update(rope_theta=-256.0), "rope_theta"),  # NaN rotary factors
    (lambda d: d["model"]["action_config"].update(rope_theta=0.0), "rope_theta"),  # a traceback at export
    (lambda d: d["model"]["action_config"].update(mouse_qk_dim_list=[-2, 10, 8]), "mouse_qk_dim_list"),
    (lambda d: d["model"].update(local_attn_size=1_000_000), "local_attn_size"),  # out of memory at export
    (lambda d: d["inference"].update(timestep_shift=1e-8), "timestep_shift"),  # NaN sigmas: a stream blamed the weights
    (lambda d: d["inference"].update(timestep_shift=1e39), "timestep_shift"),
    (lambda d: d["inference"].update(vae_dim=1_048_576), "vae_dim"),  # a 1.9 PB allocation's traceback
    (lambda d: d["model"].update(clip_tokens=1_048_576), "clip_tokens"),  # 180 GiB of cross-attention K/V
])
def test_a_config_that_would_go_wrong_later_is_refused_when_read(tmp_path, edit, message):
    from click.testing import CliRunner
    from wan_trt.cli import main
    result = CliRunner().invoke(main, ["info", "--config", str(_preset_with(tmp_path, edit))])
    assert result.exit_code == 1 and isinstance(result.exception, SystemExit), result.output
    errors = [line for line in result.output.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and message in errors[0] and "Traceback" not in result.output, result.output


@pytest.mark.parametrize("text, message", [('"dim": 1' + "0" * 5000, "a number too long"),
                                           ('"eps": 1' + "0" * 400, "eps")])
def test_numbers_too_large_for_their_field_are_one_error_line(tmp_path, text, message):
    """A 5000-digit integer (Python's int-from-text limit) and an integer past a float crashed with tracebacks."""
    from click.testing import CliRunner
    from wan_trt.cli import main
    import json
    data = json.loads((Path(__file__).parents[2] / "wan_trt" / "configs" / "universal-small.json").read_text())
    key = text.split('"')[1]
    data["model"][key] = "PLACEHOLDER"
    path = tmp_path / "cfg.json"
    path.write_text(json.dumps(data).replace('"PLACEHOLDER"', text.split(": ")[1]))
    result = CliRunner().invoke(main, ["info", "--config", str(path)])
    assert result.exit_code == 1 and isinstance(result.exception, SystemExit), result.output
    assert result.output.startswith("error:") and message in result.output, result.output


def test_a_config_path_is_the_file_named_never_a_preset_or_a_file_beside_it(tmp_path, monkeypatch):
    """`--config /some/folder/cfg` was tried first as the preset `PRESETS/<text>.json`, which for an absolute path
    is `/some/folder/cfg.json`: a file beside the one named was loaded instead, without a word (and a relative
    path was resolved against the presets' folder). A preset is a bare name; any other text is the file named."""
    named, beside = tmp_path / "cfg", tmp_path / "cfg.json"
    data = json.loads((PRESET_DIR / "universal-small.json").read_text())
    named.write_text(json.dumps({**data, "name": "named"}))
    beside.write_text(json.dumps({**data, "name": "beside"}))
    assert load_config(str(named)).name == "named" and load_config(named).name == "named"
    monkeypatch.chdir(PRESET_DIR)  # a relative path with a folder, from where the presets are
    with pytest.raises(WanTrtError, match="neither a preset nor a file"):
        load_config("../configs/universal-small")
    assert load_config("universal-small").name == "universal-small"


def test_a_pipe_or_a_folder_given_as_config_is_named_as_such(tmp_path):
    import os
    os.mkfifo(tmp_path / "fifo.json")
    with pytest.raises(WanTrtError, match="is not a regular file"):
        load_config(tmp_path / "fifo.json")
    with pytest.raises(WanTrtError, match="is a folder without a config.json"):
        load_config(tmp_path)


def test_a_key_given_twice_in_a_config_is_refused(tmp_path):
    """JSON keeps the last of two equal keys without a word: '"num_layers": 4, "num_layers": 2' built 2 layers."""
    text = (PRESET_DIR / "universal-small.json").read_text()
    path = tmp_path / "twice.json"
    path.write_text(text.replace('"model": {', '"model": {"num_layers": 4, ', 1))
    assert '"num_layers": 4' in path.read_text()
    with pytest.raises(WanTrtError, match="key 'num_layers' appears twice in one object"):
        load_config(path)


def test_a_comment_key_may_repeat(tmp_path):
    """Keys starting with '_' are comments, read by nothing: repeating one is no ambiguity."""
    text = (PRESET_DIR / "universal-small.json").read_text()
    path = tmp_path / "comments.json"
    path.write_text(text.replace('"model": {', '"_note": "a", "_note": "b", "model": {', 1))
    assert load_config(path) == load_config("universal-small")


def test_a_config_json_named_from_its_own_folder(tmp_path, monkeypatch):
    """`--config config.json` (or `.`) in the config's own folder took the name '' from the relative path and was
    refused; a folder name that cannot name outputs is refused saying where the name came from."""
    folder = tmp_path / "up"
    folder.mkdir()
    path = _upstream(folder, lambda d: None)
    monkeypatch.chdir(folder)
    for given in ("config.json", ".", "./config.json"):
        assert load_config(given).name == "up"
    odd = tmp_path / "my model"
    odd.mkdir()
    (odd / "config.json").write_text(path.read_text())
    with pytest.raises(WanTrtError, match=r"name 'my model' \(the config file's name, or its folder's for a "
                                          r"config.json: rename it\)"):
        load_config(odd / "config.json")


@pytest.mark.parametrize("value, message", [("yes", "expected a JSON boolean"), (True, "true is not supported: true "
                                            "adds an fps embedding")])
def test_inject_sample_info_is_checked_not_ignored(tmp_path, value, message):
    """Upstream's inject_sample_info was skipped unread: "yes", or true (an fps embedding this model lacks), loaded
    as if false."""
    path = _upstream(tmp_path, lambda d: d.__setitem__("inject_sample_info", value))
    with pytest.raises(WanTrtError, match=message):
        load_config(path)
    path = _upstream(tmp_path, lambda d: d.__setitem__("inject_sample_info", False))
    assert load_config(path).model == load_config("universal").model


@pytest.mark.parametrize("graph", ["dit", "decoder"])
def test_a_model_larger_than_the_machine_allows_is_refused_before_it_is_drawn(tmp_path, monkeypatch, graph):
    """A decoder of vae_dim 960 (a typo for 96: 7.3 B parameters, 27 GiB in fp32) passed every bound and ended in the
    allocator's traceback or the out-of-memory killer on a machine with less; so did a DiT within the parameter bound.
    Seeded weights are drawn only where they take at most 80 % of the machine's memory (here said to be 8 GiB)."""
    from wan_trt import sizes
    from wan_trt.model import build_decoder, build_model
    monkeypatch.setattr(sizes, "host_memory", lambda: 8 << 30)
    edit = (lambda d: d.update(name="big") or d["inference"].update(vae_dim=960)) if graph == "decoder" else \
        (lambda d: d.update(name="big") or d["model"].update(num_layers=1024, ffn_dim=32768))  # 4.3 B parameters
    cfg = load_config(_preset_with(tmp_path, edit))
    build = build_decoder if graph == "decoder" else build_model
    with pytest.raises(WanTrtError, match=r"B parameters, .* GiB in fp32, and this machine has 8.0 GiB; fix "
                                          + ("inference.vae_dim" if graph == "decoder" else "dim")):
        build(cfg)


def test_a_config_file_named_as_a_preset_must_be_that_preset(tmp_path):
    """A file keeping a preset's name with other contents (a copy edited) wrote its outputs into the preset's default
    folders (out/universal-small_...), and the commands wan-trt advised named the preset: following one wrote the
    preset's model over the file's export. Such a file is refused; a copy equal to the preset is still the preset."""
    import json
    data = load_config("universal-small").to_dict()
    same = tmp_path / "same.json"
    same.write_text(json.dumps(data))
    assert load_config(same) == load_config("universal-small")
    data["model"]["num_layers"] = 3
    edited = tmp_path / "edited.json"
    edited.write_text(json.dumps(data))
    with pytest.raises(WanTrtError, match="its name 'universal-small' is a preset's, and it is not that preset"):
        load_config(edited)
    data["name"] = "mine"
    edited.write_text(json.dumps(data))
    assert load_config(edited).name == "mine"
