import pytest
import torch

from wan_trt.config import load_config
from wan_trt.errors import WanTrtError
from wan_trt.model import build_model
from wan_trt.model.checkpoint import read_state_dict, save_checkpoint


@pytest.mark.parametrize("suffix", [".safetensors", ".pt"])
def test_upstream_named_checkpoint_loads_strictly(tmp_path, small_cfg, suffix):
    src = build_model(small_cfg, seed=11)
    path = save_checkpoint(src, tmp_path / f"ckpt{suffix}")
    keys = read_state_dict(path)
    assert all(k.startswith("model.") for k in keys)  # upstream's wrapper prefix
    assert any(k.startswith("model.blocks.0.action_model.") for k in keys)
    loaded = build_model(small_cfg, torch.bfloat16, weights=path)
    for (name, a), (_, b) in zip(src.state_dict().items(), loaded.state_dict().items()):
        assert b.dtype == torch.bfloat16
        torch.testing.assert_close(b.float(), a.to(torch.bfloat16).float(), msg=name)
    assert loaded.rope.frame_cos.device.type == "cpu"  # tables rebuilt after the meta-device load


def test_without_prefix_and_wrapped(tmp_path, small_cfg):
    src = build_model(small_cfg, seed=5)
    torch.save({"state_dict": src.state_dict()}, tmp_path / "w.pth")
    loaded = build_model(small_cfg, weights=tmp_path / "w.pth")
    assert torch.equal(loaded.head.head.weight, src.head.head.weight)


def _corrupt(tmp_path, small_cfg, edit):
    state = {f"model.{k}": v for k, v in build_model(small_cfg).state_dict().items()}
    edit(state)
    from safetensors.torch import save_file
    path = tmp_path / "bad.safetensors"
    save_file(state, str(path))
    return path


def test_corrupted_checkpoint_names_the_bad_keys(tmp_path, small_cfg):
    def edit(state):
        state["model.blocks.1.ffn.0.weight"] = state["model.blocks.1.ffn.0.weight"][:, :-1].contiguous()
        state["model.blocks.0.extra.weight"] = torch.zeros(2)
        del state["model.head.modulation"]
    with pytest.raises(WanTrtError) as err:
        build_model(small_cfg, weights=_corrupt(tmp_path, small_cfg, edit))
    msg = str(err.value)
    assert "1 missing key(s): head.modulation" in msg
    assert "1 unexpected key(s): blocks.0.extra.weight" in msg
    assert "blocks.1.ffn.0.weight: checkpoint (128, 63), model (128, 64)" in msg


def test_checkpoint_of_another_config_fails(tmp_path):
    path = save_checkpoint(build_model(load_config("templerun-small")), tmp_path / "tr.safetensors")
    with pytest.raises(WanTrtError, match="mouse_mlp"):
        build_model(load_config("universal-small"), weights=path)


def test_unreadable_files(tmp_path):
    junk = tmp_path / "junk.safetensors"
    junk.write_bytes(b"not a checkpoint")
    with pytest.raises(WanTrtError, match="cannot read"):
        read_state_dict(junk)
    with pytest.raises(WanTrtError, match="no such file"):
        read_state_dict(tmp_path / "missing.pt")
    (tmp_path / "w.onnx").write_bytes(b"")
    with pytest.raises(WanTrtError, match="expected a .safetensors"):
        read_state_dict(tmp_path / "w.onnx")
