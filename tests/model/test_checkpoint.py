import re

import pytest
import torch

from wan_trt.config_load import load_config
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
    assert loaded.rope.hw_cos.device.type == "cpu"  # tables rebuilt after the meta-device load
    # constants of the fused layers, not weights: made anew (a meta-device load leaves none)
    assert not any(re.search("unit_gate|_unit$", k) for k in keys)
    for model, dtype in ((src, torch.float32), (loaded, torch.bfloat16)):
        units = [block.unit_gate for block in model.blocks]
        units += [getattr(b.action_model, n) for b in model.blocks if b.action_model is not None
                  for n in ("mouse_unit", "keyboard_unit") if hasattr(b.action_model, n)]
        assert len(units) > len(model.blocks)
        for unit in units:
            assert unit.device.type == "cpu" and torch.equal(unit, torch.ones(unit.shape, dtype=dtype))


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


def _cli(*args):
    from click.testing import CliRunner
    from wan_trt.cli import main
    return CliRunner().invoke(main, list(args))


def _stream(weights, out):
    """`wan-trt stream` of one small block; returns the latents it wrote."""
    args = ["stream", "--config", "universal-small", "--blocks", "1", "--device", "cpu", "--out", str(out)]
    result = _cli(*args, *(["--weights", str(weights)] if weights else []))
    assert result.exit_code == 0, result.output
    return torch.load(out / "latents.pt")


def test_training_checkpoint_wrapped_in_state_dict_loads_through_the_cli(tmp_path):
    """{'state_dict': ...} beside optimizer state and counters, as training scripts write them."""
    src = build_model(load_config("universal-small"), seed=7)
    plain = save_checkpoint(src, tmp_path / "plain.safetensors")
    state = {f"model.{k}": v for k, v in src.state_dict().items()}
    torch.save({"state_dict": state, "optimizer_states": [{"state": {}, "param_groups": [{"lr": 1e-5}]}],
                "epoch": 3, "global_step": 1200, "pytorch-lightning_version": "2.4.0"}, tmp_path / "train.ckpt")
    wrapped = _stream(tmp_path / "train.ckpt", tmp_path / "a")
    assert torch.equal(wrapped, _stream(plain, tmp_path / "b"))
    assert not torch.equal(wrapped, _stream(None, tmp_path / "c"))  # the weights were really used


def _saved(tmp_path, small_cfg, edit, name="bad.safetensors"):
    state = {f"model.{k}": v.clone() for k, v in build_model(small_cfg).state_dict().items()}
    edit(state)
    path = tmp_path / name
    if path.suffix == ".safetensors":
        from safetensors.torch import save_file
        save_file(state, str(path))
    else:
        torch.save(state, path)
    return path


def test_integer_tensors_where_float_weights_are_expected(tmp_path):
    cfg = load_config("universal-small")
    path = _saved(tmp_path, cfg, lambda s: s.update({k: (v * 100).to(torch.int32) for k, v in s.items()}), "w.pt")
    with pytest.raises(WanTrtError, match=r"w\.pt.*int32.*model\.blocks\.0\.ffn\.0\.weight|"
                                          r"w\.pt.*model\.[\w.]+ \(int32\)"):
        build_model(cfg, weights=path)
    result = _cli("stream", "--config", "universal-small", "--weights", str(path), "--blocks", "1", "--device", "cpu")
    assert result.exit_code == 1 and isinstance(result.exception, SystemExit)
    errors = [line for line in result.output.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "int32" in result.output and "Traceback" not in result.output


def test_nan_and_inf_weights_fail_at_load_naming_key_and_file(tmp_path):
    cfg = load_config("universal-small")

    def edit(state):
        state["model.blocks.1.ffn.0.weight"][3, 5] = float("nan")
        state["model.head.head.bias"][0] = float("inf")
    path = _saved(tmp_path, cfg, edit)
    with pytest.raises(WanTrtError) as err:
        build_model(cfg, weights=path)
    msg = str(err.value)
    assert str(path) in msg and msg.count("\n") < 8
    assert "model.blocks.1.ffn.0.weight (1 NaN)" in msg and "model.head.head.bias (1 Inf)" in msg


def test_weights_that_overflow_float16_fail_at_load(tmp_path):
    cfg = load_config("universal-small")
    path = _saved(tmp_path, cfg, lambda s: s["model.blocks.0.ffn.2.weight"].__setitem__((0, 0), 1e6))
    build_model(cfg, torch.bfloat16, weights=path)  # bf16 holds 1e6
    with pytest.raises(WanTrtError, match=r"overflow float16.*model\.blocks\.0\.ffn\.2\.weight \(max \|w\| 1e\+06\)"):
        build_model(cfg, torch.float16, weights=path)


def test_ambiguous_or_foreign_wrappers_are_refused(tmp_path):
    state = dict(build_model(load_config("universal-small")).state_dict())
    torch.save({"generator": state, "generator_ema": state, "step": 5}, tmp_path / "sf.pt")
    with pytest.raises(WanTrtError, match=r"several state dicts \(generator, generator_ema\).*ckpt\['generator'\]"):
        read_state_dict(tmp_path / "sf.pt")
    torch.save({"weights": state, "step": 5}, tmp_path / "other.pt")
    with pytest.raises(WanTrtError, match=r"expected a state dict of tensors.*found weights \(dict\), step \(int\)"):
        read_state_dict(tmp_path / "other.pt")


def test_keys_that_are_not_names_are_refused_by_name(tmp_path):
    """A state dict keyed by integers crashed (AttributeError: 'int' object has no attribute 'startswith')."""
    torch.save({0: torch.zeros(3), "blocks.0.x": torch.zeros(1)}, tmp_path / "ints.pt")
    with pytest.raises(WanTrtError, match=r"keys are parameter names \(strings\); found 0 \(int\)"):
        read_state_dict(tmp_path / "ints.pt")


def test_the_other_models_checkpoint_is_named_with_the_flag_it_belongs_to(tmp_path):
    """A Wan2.1 VAE file given as --weights listed 165 missing keys and told the user to pick another --config;
    a DiT checkpoint given as --vae-weights, to pass the Wan2.1 VAE. Each now names the flag it belongs to."""
    from wan_trt.model import build_decoder
    from tests.model.test_vae import _write_vae_file
    cfg = load_config("universal-small")
    _write_vae_file(build_decoder(cfg), tmp_path / "vae.pth")
    dit = save_checkpoint(build_model(cfg), tmp_path / "dit.safetensors")
    with pytest.raises(WanTrtError, match="holds a video VAE's keys .*: pass it with --vae-weights, not --weights"):
        build_model(cfg, weights=tmp_path / "vae.pth")
    with pytest.raises(WanTrtError, match=r"holds a DiT's keys \(blocks.\*\), not a VAE's: pass it with --weights"):
        build_decoder(cfg, weights=dit)
    with pytest.raises(WanTrtError, match="pick the --config the checkpoint was trained with"):  # the usual hint
        build_model(cfg, weights=save_checkpoint(build_model(load_config("templerun-small")), tmp_path / "tr.pt"))


@pytest.mark.parametrize("dtype, what", [(torch.float8_e4m3fn, "FP8-quantized values"),
                                         (torch.complex64, "complex numbers"), (torch.bool, "booleans")])
def test_fp8_complex_and_bool_tensors_are_named_as_such(tmp_path, dtype, what):
    """An FP8-quantized checkpoint ended in a NotImplementedError traceback ('isfinite' has no float8 kernel);
    complex and bool tensors were called integers."""
    cfg = load_config("universal-small")
    key = "model.blocks.0.ffn.0.weight"
    for name in ("w.pt", "w.safetensors"):
        if dtype is torch.complex64 and name.endswith("safetensors"):
            continue  # safetensors has no complex dtype
        path = _saved(tmp_path, cfg, lambda s: s.__setitem__(key, s[key].to(dtype)), name)
        with pytest.raises(WanTrtError, match=rf"1 tensor\(s\) hold {what} where float weights are expected: "
                                              rf"{re.escape(key)}"):
            build_model(cfg, weights=path)


def test_an_ema_beside_the_model_is_refused_not_dropped(tmp_path):
    """{"model": ..., "ema": ...} loaded 'model' without a word ('ema' is not a name wan-trt unwraps)."""
    state = dict(build_model(load_config("universal-small")).state_dict())
    torch.save({"model": state, "ema": state, "step": 5, "opt": {"state": {}, "param_groups": [{"lr": 1.0}]}},
               tmp_path / "train.pt")
    with pytest.raises(WanTrtError, match=r"several state dicts \(ema, model\)"):
        read_state_dict(tmp_path / "train.pt")
    torch.save({"model": state, "step": 5, "opt": {"state": {}, "param_groups": [{"lr": 1.0}]}}, tmp_path / "ok.pt")
    assert read_state_dict(tmp_path / "ok.pt").keys() == state.keys()


def test_a_misnamed_file_is_named_by_its_format(tmp_path):
    """A safetensors file named .pt got torch.load's advice to turn weights_only off (arbitrary code execution);
    a torch.save file named .safetensors, 'header too large'."""
    cfg = load_config("universal-small")
    st = _saved(tmp_path, cfg, lambda s: None, "w.safetensors")
    pt = _saved(tmp_path, cfg, lambda s: None, "w.pt")
    (tmp_path / "st.pt").write_bytes(st.read_bytes())
    (tmp_path / "pt.safetensors").write_bytes(pt.read_bytes())
    with pytest.raises(WanTrtError, match=r"a safetensors file named \.pt; rename it to \.safetensors") as err:
        read_state_dict(tmp_path / "st.pt")
    assert "weights_only" not in str(err.value)
    with pytest.raises(WanTrtError, match=r"a torch.save file named \.safetensors; rename it to \.pt"):
        read_state_dict(tmp_path / "pt.safetensors")
    assert read_state_dict(st).keys() == read_state_dict(pt).keys()


@pytest.mark.parametrize("name", ["w.pt", "w.safetensors"])
def test_an_empty_checkpoint_is_named_as_empty(tmp_path, name):
    """An empty file (a copy or download that did not finish) was refused as "cannot read it (EOFError: )" (or a
    safetensors error), which named no cause and no fix."""
    (tmp_path / name).write_bytes(b"")
    with pytest.raises(WanTrtError, match=rf"--weights {re.escape(str(tmp_path / name))}: an empty file"):
        read_state_dict(tmp_path / name)


def test_overflow_advice_names_only_precisions_that_hold_the_values(tmp_path):
    """An fp32 3.4e38 loaded at bf16 was told to pass --precision bf16; a float64 1e300 was told bf16 or fp32."""
    from wan_trt.model.checkpoint import check_values
    with pytest.raises(WanTrtError, match=r"overflow bfloat16.*; pass --precision fp32$"):
        check_values({"w": torch.tensor([3.4e38])}, "f.pt", torch.bfloat16)
    with pytest.raises(WanTrtError, match="no precision holds them"):
        check_values({"w": torch.tensor([1e300], dtype=torch.float64)}, "f.pt", torch.float32)
