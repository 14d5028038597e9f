import json

import pytest

from wan_trt.config import load_config, preset_names
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
    from wan_trt.config import config_from_dict
    for name in FULL + SMALL:
        cfg = load_config(name)
        assert config_from_dict(json.loads(json.dumps(cfg.to_dict())), name) == cfg
