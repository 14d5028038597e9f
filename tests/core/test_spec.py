import json

import pytest
import torch

from wan_trt.config_load import load_config
from wan_trt.errors import WanTrtError
from wan_trt.scheduler import BlockSchedule
from wan_trt.spec import PassSpec


def test_universal_bf16_contract():
    spec = PassSpec.from_config(load_config("universal"), "bf16")
    shapes = {t.name: (t.shape, t.dtype) for t in spec.inputs + spec.outputs}
    assert shapes["latents"] == ((1, 16, 3, 44, 80), "bfloat16")
    assert shapes["timestep"] == ((1, 3), "float32")
    assert shapes["self_k_prev_00"] == shapes["self_v_prev_29"] == ((1, 2640, 12, 128), "bfloat16")
    assert shapes["self_v_cur_00"] == shapes["self_k_cur_29"] == ((1, 2640, 12, 128), "bfloat16")
    assert shapes["mouse_k_prev_14"] == ((880, 3, 16, 64), "bfloat16") and "mouse_k_prev_15" not in shapes
    assert shapes["keyboard_v_cur_00"] == ((1, 3, 16, 64), "bfloat16")
    assert len(spec.outputs) == 1 + 2 * 30 + 2 * 2 * 15  # flow, then K and V of every cache layer
    assert spec.cache("self").pairs[:2] == (("self_k_prev_00", "self_k_cur_00"), ("self_v_prev_00", "self_v_cur_00"))
    assert shapes["mouse_window"] == ((1, 3, 12, 2), "bfloat16")
    assert shapes["frame_rope_cos"] == ((3, 22), "float32") and shapes["action_rope_sin"] == ((3, 4), "float32")
    assert shapes["valid_frames"] == ((1,), "int32") and "rope_offset" not in shapes
    assert spec.output_names[0] == "flow"


def test_templerun_and_gta_contracts():
    tr = PassSpec.from_config(load_config("templerun"), "fp16")
    assert "mouse_window" not in tr.input_names and not any(n.startswith("mouse_") for n in tr.output_names)
    assert tr.tensor("keyboard_window").shape == (1, 3, 12, 7)
    gta = PassSpec.from_config(load_config("gta_drive"), "bf16")
    assert gta.tensor("self_k_prev_29").shape == (1, 880, 12, 128)  # P = 1 frame


def test_manifest_round_trip_and_allocation_from_it(tmp_path):
    spec = PassSpec.from_config(load_config("gta_drive-small"), "fp32")
    path = tmp_path / "manifest.json"
    path.write_text(json.dumps(spec.to_dict()))
    again = PassSpec.from_dict(json.loads(path.read_text()))
    assert again == spec and again.fingerprint() == spec.fingerprint()
    buffers = again.allocate("inputs") | again.allocate("outputs")
    for t in spec.inputs + spec.outputs:
        assert buffers[t.name].shape == t.shape and buffers[t.name].dtype == t.torch_dtype


def test_edited_manifest_is_refused():
    data = PassSpec.from_config(load_config("universal-small"), "fp32").to_dict()
    data["inputs"][0]["shape"] = [1, 16, 3, 4, 7]
    with pytest.raises(WanTrtError, match="does not match its own config"):
        PassSpec.from_dict(data)


def test_check_feeds_names_each_problem():
    spec = PassSpec.from_config(load_config("universal-small"), "fp32")
    feeds = spec.sample_inputs()
    spec.check_feeds(feeds)
    feeds["latents"] = feeds["latents"][:, :, :2]
    feeds["timestep"] = feeds["timestep"].double()
    del feeds["frame_rope_cos"]
    feeds["extra"] = torch.zeros(1)
    with pytest.raises(WanTrtError) as err:
        spec.check_feeds(feeds)
    msg = str(err.value)
    for part in ("missing input 'frame_rope_cos'", "unexpected input 'extra'", "input 'latents': expected [1, 16, 3, 4, 6]",
                 "input 'timestep'"):
        assert part in msg


@pytest.mark.parametrize("name", ["universal-small", "templerun-small"])
def test_sample_timesteps_come_from_the_config_schedule(name):
    """templerun's 4-step schedule (1000, 937.5, 833.3, 625) differs from universal's 3-step one."""
    cfg = load_config(name)
    sched = BlockSchedule.from_config(cfg)
    expected = {*sched.timesteps, sched.clean_timestep}
    spec = PassSpec.from_config(cfg, "fp32")
    seen = {float(spec.sample_inputs(seed=s)["timestep"][0, 0]) for s in range(40)}
    assert seen == expected, (seen, expected)


def test_manifest_of_the_rope_offset_contract_is_refused():
    """A manifest written before the rotary inputs (spec_version 1, an int32 rope_offset) says to re-export."""
    data = PassSpec.from_config(load_config("universal-small"), "fp32").to_dict()
    data["spec_version"] = 1
    with pytest.raises(WanTrtError, match="re-export"):
        PassSpec.from_dict(data)


def test_sample_inputs_carry_the_rotary_factors_of_their_start_frame():
    spec = PassSpec.from_config(load_config("universal-small"), "fp32")
    feeds = spec.sample_inputs(start_frame=5000)
    for r in spec.rotaries:
        cos, sin = r.factors(5000, 3)
        assert torch.equal(feeds[r.cos], cos) and torch.equal(feeds[r.sin], sin)
    assert not torch.equal(feeds["frame_rope_cos"], spec.sample_inputs(start_frame=3)["frame_rope_cos"])
