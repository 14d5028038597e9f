import json
import re

import pytest
import torch

from click.testing import CliRunner

from wan_trt.cli import main
from wan_trt.errors import WanTrtError


def test_stream_command_matches_reference(tmp_path):
    res = CliRunner().invoke(main, ["stream", "--config", "gta_drive-small", "--blocks", "8", "--reference",
                                    "--device", "cpu", "--out", str(tmp_path)])
    assert res.exit_code == 0, res.output
    report = json.loads((tmp_path / "report.json").read_text())
    assert report["summary"]["reference_match"] and len(report["reference"]) == 8
    assert (tmp_path / "latents.pt").is_file()


def test_a_reference_block_that_is_not_finite_is_no_match(tmp_path, monkeypatch):
    """A NaN in a later block's reference gave rel-L2 NaN, which max() passed over: a match, exit 0."""
    import wan_trt.engines.stream as run

    real = run.reference_stream

    def broken(*args, **kwargs):
        blocks = real(*args, **kwargs)
        blocks[1] = torch.full_like(blocks[1], float("nan"))
        return blocks
    monkeypatch.setattr(run, "reference_stream", broken)
    res = CliRunner().invoke(main, ["stream", "--config", "gta_drive-small", "--blocks", "3", "--reference",
                                    "--device", "cpu", "--out", str(tmp_path / "s")])
    assert res.exit_code == 1, res.output
    report = json.loads((tmp_path / "s" / "report.json").read_text(), parse_constant=_not_strict_json)
    assert report["summary"]["reference_match"] is False and report["summary"]["worst_rel_l2"] is None
    assert report["reference"][1]["reference_non_finite"] > 0 and report["reference"][1]["rel_l2"] is None


def _not_strict_json(constant):
    """report.json held NaN and Infinity where that block's errors had them, which strict JSON parsers refuse:
    they are null now, the non_finite counts saying why."""
    raise AssertionError(f"report.json holds {constant}, which is not JSON")


@pytest.mark.parametrize("flag", ["--video", "--no-video", "--overwrite"])
def test_an_output_flag_without_out_is_refused_not_dropped(flag):
    """--video, --no-video and --overwrite act on what --out writes: without --out they were dropped and the
    stream exited 0 having written nothing."""
    res = CliRunner().invoke(main, ["stream", "--config", "universal-small", "--blocks", "1", "--device", "cpu", flag])
    assert res.exit_code == 1 and f"{flag}: " in res.output and "--out" in res.output, res.output


def test_out_never_replaces_what_wan_trt_did_not_write(tmp_path, monkeypatch):
    """--out holding a user's video.mp4 had it overwritten, and a link there had its target outside --out
    overwritten with the latents."""
    import wan_trt.engines.stream as run

    def no_model(*a, **k):
        raise AssertionError("a model was built before --out was checked")
    out = tmp_path / "out"
    out.mkdir()
    (out / "video.mp4").write_text("my holiday video")
    outside = tmp_path / "precious.txt"
    outside.write_text("keep me")
    (out / "latents.pt").symlink_to(outside)
    with monkeypatch.context() as patch:
        patch.setattr(run, "build_model", no_model)
        res = CliRunner().invoke(main, ["stream", "--config", "gta_drive-small", "--blocks", "1", "--device", "cpu",
                                        "--out", str(out), "--overwrite"])
    assert res.exit_code == 1 and res.output.startswith("error: --out ") and "video.mp4" in res.output, res.output
    assert (out / "video.mp4").read_text() == "my holiday video" and outside.read_text() == "keep me"


def test_an_earlier_stream_output_is_replaced_only_with_overwrite(tmp_path):
    out = tmp_path / "s"
    args = ["stream", "--config", "gta_drive-small", "--blocks", "1", "--device", "cpu", "--no-video", "--out", str(out)]
    assert CliRunner().invoke(main, args).exit_code == 0
    first = (out / "report.json").read_text()
    res = CliRunner().invoke(main, args)
    assert res.exit_code == 1 and "--overwrite" in res.output and (out / "report.json").read_text() == first
    res = CliRunner().invoke(main, args + ["--seed", "3", "--overwrite"])
    assert res.exit_code == 0, res.output
    assert (out / "report.json").read_text() != first and (out / "latents.pt").is_file()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["s"]  # no staging folder or lock left


def test_overwrite_refuses_a_video_the_earlier_stream_did_not_write(tmp_path):
    """An output written with --no-video holds no video.mp4 of wan-trt's: one found there later is the user's,
    and --overwrite refuses it by name rather than delete it."""
    out = tmp_path / "s"
    args = ["stream", "--config", "gta_drive-small", "--blocks", "1", "--device", "cpu", "--no-video", "--out", str(out)]
    assert CliRunner().invoke(main, args).exit_code == 0
    (out / "video.mp4").write_text("my own render")
    res = CliRunner().invoke(main, args + ["--overwrite"])
    assert res.exit_code == 1 and "video.mp4" in res.output, res.output
    assert (out / "video.mp4").read_text() == "my own render"


def _refused(tmp_path, monkeypatch, *args):
    """Run `stream` with ``args``; it must fail with one error line, build no model and write nothing."""
    import wan_trt.engines.stream as run

    def no_model(*a, **k):
        raise AssertionError("a model was built before the arguments were checked")
    monkeypatch.setattr(run, "build_model", no_model)
    out = tmp_path / "out"
    res = CliRunner().invoke(main, ["stream", "--config", "universal-small", "--out", str(out), *args])
    assert res.exit_code == 1 and isinstance(res.exception, SystemExit), res.output
    assert res.output.startswith("error: ") and "Traceback" not in res.output
    assert not out.exists()
    return res.output


def test_more_blocks_than_memory_holds_are_refused_up_front(tmp_path, monkeypatch):
    out = _refused(tmp_path, monkeypatch, "--blocks", "50000000", "--device", "cpu")
    assert "--blocks 50000000" in out and "GiB" in out and "pass fewer blocks" in out


def test_more_blocks_than_a_stream_can_reach_are_refused_up_front(tmp_path, monkeypatch):
    out = _refused(tmp_path, monkeypatch, "--blocks", "89478486", "--device", "cpu")
    assert "--blocks 89478486" in out and "268435456 latent frames" in out and "89478485 or fewer" in out


@pytest.mark.parametrize("device, message", [("cuda:99", "--device cuda:99: no CUDA"), ("gpu0", "not a torch device"),
                                             ("mps", "cpu or cuda")])
def test_bad_device_is_one_error_line(tmp_path, monkeypatch, device, message):
    assert message in _refused(tmp_path, monkeypatch, "--blocks", "2", "--device", device)


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without a CUDA GPU")
def test_cuda_without_a_gpu_is_one_error_line(tmp_path, monkeypatch):
    out = _refused(tmp_path, monkeypatch, "--blocks", "2", "--device", "cuda")
    assert "no CUDA GPU" in out and "--device cpu" in out


def test_stream_request_checks(tmp_path):
    from wan_trt.config_load import load_config
    from wan_trt.engines.stream import check_stream_request
    from wan_trt.errors import WanTrtError

    cfg = load_config("gta_drive-small")
    good = dict(blocks=2, precision="fp32", device="cpu", weights=None, out=None)
    check_stream_request(cfg, **good)
    file = tmp_path / "file"
    file.write_text("")
    for bad, message in ((dict(blocks=0), "--blocks: expected an int >= 1, got 0"),
                         (dict(precision="int8"), "--precision 'int8': expected one of fp32, bf16, fp16"),
                         (dict(weights=str(tmp_path / "missing.safetensors")), "missing.safetensors: no such file"),
                         (dict(out=file), "is a file, not a folder")):
        with pytest.raises(WanTrtError, match=message):
            check_stream_request(cfg, **{**good, **bad})


def test_400_blocks_stream_past_the_old_rope_table_end(tmp_path):
    """Upstream stops at block 341 (frame 1024); a stream goes on (17 s on 2 cores: latents only)."""
    out = tmp_path / "out"
    res = CliRunner().invoke(main, ["stream", "--config", "universal-small", "--blocks", "400", "--device", "cpu",
                                    "--no-video", "--out", str(out)])  # the frames: the tests below
    assert res.exit_code == 0, res.output
    report = json.loads((out / "report.json").read_text())
    assert len(report["block_ms"]) == 400
    latents = torch.load(out / "latents.pt")
    assert latents.shape[2] == 1200 and torch.isfinite(latents).all()


def test_stream_out_writes_a_video_of_every_decoded_frame(tmp_path):
    """9 video frames for the first block, 12 for each after; the block-by-block decode (histories
    carried) equals one decode of all the latents at once."""
    from wan_trt.config_load import load_config
    from wan_trt.engines.stream import StreamOptions, stream_decoder
    from wan_trt.model import build_decoder
    from wan_trt.video import count_frames, to_uint8_frames

    out = tmp_path / "out"
    res = CliRunner().invoke(main, ["stream", "--config", "gta_drive-small", "--blocks", "3", "--out", str(out)])
    assert res.exit_code == 0, res.output
    report = json.loads((out / "report.json").read_text())
    assert report["summary"]["video_frames"] == 9 + 12 * 2 == count_frames(out / "video.mp4")
    assert len(report["decode_ms"]) == 3
    assert set(report["stage_ms"][0]) == {"passes", "clean", "checks", "decode", "commit"}
    cfg = load_config("gta_drive-small")
    latents = torch.load(out / "latents.pt")
    with stream_decoder(cfg, StreamOptions()) as blockwise:
        frames = torch.cat([blockwise.decode(block) for block in latents.split(3, dim=2)])
    decoder = build_decoder(cfg)
    with torch.no_grad():
        whole, _ = decoder(latents, decoder.empty_history(1, 4, 6), first=True)
    assert frames.shape == (33, 32, 48, 3)
    assert (frames.int() - to_uint8_frames(whole).int()).abs().max() <= 1


def test_no_video_and_a_missing_vae_checkpoint(tmp_path, monkeypatch):
    out = tmp_path / "plain"
    res = CliRunner().invoke(main, ["stream", "--config", "templerun-small", "--blocks", "1", "--out", str(out),
                                    "--no-video"])
    assert res.exit_code == 0 and not (out / "video.mp4").exists() and (out / "latents.pt").exists()
    message = _refused(tmp_path, monkeypatch, "--blocks", "1", "--vae-weights", str(tmp_path / "nope.pth"))
    assert "--vae-weights" in message and "no such file" in message


def test_actions_come_from_a_json_lines_file(tmp_path):
    """Held and per-frame actions from the file reach the stream (they change its latents), and each
    defect is refused with its line before any block runs."""
    from wan_trt.actions import read_actions
    from wan_trt.config_load import load_config

    cfg = load_config("universal-small")
    keys = cfg.model.action_config.keyboard_dim_in
    lines = [{"mouse": [0.1, -0.2], "keyboard": [1] + [0] * (keys - 1)},
             {"mouse": [[0.01 * i, 0.0] for i in range(12)], "keyboard": [0] * keys}]
    path = tmp_path / "actions.jsonl"
    path.write_text("\n".join(json.dumps(line) for line in lines) + "\n\n")
    actions = read_actions(path, cfg, 2)
    assert actions["mouse"].shape == (1, 9 + 12, 2) and actions["keyboard"].shape == (1, 21, keys)
    assert torch.equal(actions["mouse"][0, :9], torch.tensor([[0.1, -0.2]]).expand(9, 2))
    assert torch.equal(actions["mouse"][0, 9:, 0], torch.tensor([0.01 * i for i in range(12)]))
    runs = {}
    for name, extra in (("file", ["--actions", str(path)]), ("synthetic", [])):
        out = tmp_path / name
        res = CliRunner().invoke(main, ["stream", "--config", "universal-small", "--blocks", "2", "--out", str(out),
                                        "--no-video", *extra])
        assert res.exit_code == 0, res.output
        runs[name] = torch.load(out / "latents.pt")
    assert not torch.allclose(runs["file"], runs["synthetic"])
    bad = {"not JSON": "{mouse", "keys ['keyboard', 'mouse']": json.dumps({"mouse": [0, 0]}),
           "9 rows of 2": json.dumps({"mouse": [[0, 0]] * 5, "keyboard": [0] * keys}),
           "not JSON (NaN is not a JSON value)": json.dumps({"mouse": [float("nan"), 0], "keyboard": [0] * keys}),
           "2 finite numbers": json.dumps({"mouse": [10 ** 400, 0], "keyboard": [0] * keys}),
           "key 'mouse' given twice": '{"mouse": [9, 9], "keyboard": ' + str([0] * keys) + ', "mouse": [0, 0]}'}
    for message, line in bad.items():
        path.write_text(line + "\n" + json.dumps(lines[1]) + "\n")
        with pytest.raises(WanTrtError, match=re.escape(message)) as info:
            read_actions(path, cfg, 2)
        assert "line 1 (block 0)" in str(info.value)
    with pytest.raises(WanTrtError, match="2 block line"):
        read_actions(path, cfg, 3)
    path.write_bytes(b"\xff\xfe{}")
    with pytest.raises(WanTrtError, match="not UTF-8"):
        read_actions(path, cfg, 1)


def test_actions_for_a_config_without_action_inputs_are_refused(tmp_path):
    """A config with no mouse and no keyboard took an actions file of '{}' lines: the file reached nothing, yet the
    stream's report named it (path, sha256) as one of its inputs."""
    from wan_trt.config_load import load_config
    data = load_config("universal-small").to_dict()
    data["name"], data["model"]["action_config"] = "no-actions", {}
    (tmp_path / "no-actions.json").write_text(json.dumps(data))
    (tmp_path / "actions.jsonl").write_text("{}\n{}\n")
    res = CliRunner().invoke(main, ["stream", "--config", str(tmp_path / "no-actions.json"), "--blocks", "2",
                                    "--actions", str(tmp_path / "actions.jsonl"), "--out", str(tmp_path / "out"),
                                    "--no-video"])
    assert res.exit_code == 1 and "has no action inputs" in res.output and "drop --actions" in res.output, res.output
    assert not (tmp_path / "out").exists()


def test_a_stream_output_of_an_older_wan_trt_is_still_its_own(tmp_path):
    """Folders an older wan-trt wrote have no marker file: holding only the stream's files, they are still
    replaced with --overwrite (they were refused as not a stream output)."""
    out = tmp_path / "s"
    args = ["stream", "--config", "gta_drive-small", "--blocks", "1", "--device", "cpu", "--no-video", "--out", str(out)]
    assert CliRunner().invoke(main, args).exit_code == 0
    (out / ".wan-trt-export").unlink()
    res = CliRunner().invoke(main, args + ["--overwrite"])
    assert res.exit_code == 0, res.output
    (out / ".wan-trt-export").unlink()
    (out / "notes.txt").write_text("mine")
    res = CliRunner().invoke(main, args + ["--overwrite"])
    assert res.exit_code == 1 and "not a wan-trt stream output" in res.output and (out / "notes.txt").is_file()


def test_action_values_are_refused_by_line_where_the_stream_cannot_hold_them(tmp_path):
    """An integer of 5000 digits crashed the reader with a ValueError traceback (it is read as a double, inf, as the
    C++ reader reads it); a value fp16 cannot hold (7e4) passed it and stopped an fp16 stream at that block, after
    the blocks before it ran, as 'NaN or Inf'."""
    from wan_trt.actions import read_actions
    from wan_trt.config_load import load_config

    cfg = load_config("gta_drive-small")
    keys = cfg.model.action_config.keyboard_dim_in
    good = json.dumps({"mouse": [0.1, 0.0], "keyboard": [1] + [0] * (keys - 1)})
    path = tmp_path / "actions.jsonl"
    path.write_text(good + "\n" + '{"mouse": [1' + "0" * 5000 + ', 0], "keyboard": [0, 0]}\n')
    with pytest.raises(WanTrtError, match=r"line 2 \(block 1\), mouse: expected 2 finite numbers .* within \+-3.40282e"):
        read_actions(path, cfg, 2)
    path.write_text(good + "\n" + json.dumps({"mouse": [70000.0, 0.0], "keyboard": [1] + [0] * (keys - 1)}) + "\n")
    assert read_actions(path, cfg, 2)["mouse"][0, -1, 0] == 70000.0  # fp32 holds it
    with pytest.raises(WanTrtError, match=r"line 2 \(block 1\), mouse: expected 2 finite numbers .* within \+-65504"):
        read_actions(path, cfg, 2, torch.float16)


@pytest.mark.parametrize("flags", [[], ["--out", "OUT", "--no-video"]])
def test_vae_weights_that_no_decoder_would_read_are_refused(tmp_path, flags):
    """Without a video the decoder is never built: a --vae-weights file (a corrupt one too) was never opened, and
    the stream exited 0."""
    junk = tmp_path / "junk.pth"
    junk.write_bytes(b"not a checkpoint")
    args = [a.replace("OUT", str(tmp_path / "out")) for a in flags]
    res = CliRunner().invoke(main, ["stream", "--config", "universal-small", "--blocks", "1", "--device", "cpu",
                                    "--vae-weights", str(junk), *args])
    assert res.exit_code == 1 and "the video decoder runs only when the stream writes its video" in res.output, \
        res.output


def test_an_input_that_is_a_pipe_or_a_folder_is_named_as_such(tmp_path):
    """--actions <(...) (a pipe) and a folder were reported as 'no such file'."""
    import os

    from wan_trt.actions import read_actions
    from wan_trt.config_load import load_config

    fifo = tmp_path / "actions.pipe"
    os.mkfifo(fifo)
    cfg = load_config("universal-small")
    with pytest.raises(WanTrtError, match="actions.pipe: a pipe, where a file is read"):
        read_actions(fifo, cfg, 1)
    with pytest.raises(WanTrtError, match="a folder, where a file is read"):
        read_actions(tmp_path, cfg, 1)
    res = CliRunner().invoke(main, ["stream", "--config", "universal-small", "--blocks", "1", "--no-video",
                                    "--weights", str(fifo), "--out", str(tmp_path / "o")])
    assert res.exit_code == 1 and "--weights" in res.output and "a pipe" in res.output, res.output
    with pytest.raises(WanTrtError, match="no such file"):
        read_actions(tmp_path / "missing.jsonl", cfg, 1)


def test_a_missing_actions_file_is_named_by_its_flag(tmp_path, monkeypatch):
    """`stream --actions missing.jsonl` said 'error: missing.jsonl: No such file or directory (errno ENOENT); check
    the path, its permissions and the free space': the file's identity was taken before the file was judged, and
    the message named no flag. It is judged with --weights and --vae-weights, before any work."""
    missing = tmp_path / "missing.jsonl"
    message = _refused(tmp_path, monkeypatch, "--blocks", "1", "--actions", str(missing))
    assert message.strip() == f"error: --actions {missing}: no such file", message


def test_the_report_says_what_the_stream_was_made_from_and_the_log_that_it_is_not_a_scene(tmp_path):
    """report.json held no word of the weights: a stream of random weights could not be told from one of the
    model's checkpoints, and `--overwrite` could replace one with the other without a trace. With both
    checkpoints the output said nothing, as if the frames were of a real scene, though the conditioning (the
    first frame's latent, the image context) is always seeded noise. The report names each input (path, size,
    sha256) or how it was made, and the log says the conditioning is noise."""
    from wan_trt.config_load import load_config
    from wan_trt.digest import file_digest
    from wan_trt.model import build_decoder, build_model
    from wan_trt.model.checkpoint import save_checkpoint
    from tests.model.test_vae import _write_vae_file
    cfg = load_config("universal-small")
    dit = save_checkpoint(build_model(cfg, seed=3), tmp_path / "dit.safetensors")
    _write_vae_file(build_decoder(cfg, seed=3), tmp_path / "vae.pth")
    base = ["stream", "--config", "universal-small", "--blocks", "1", "--device", "cpu", "--seed", "5"]
    res = CliRunner().invoke(main, [*base, "--weights", str(dit), "--vae-weights", str(tmp_path / "vae.pth"),
                                    "--out", str(tmp_path / "real")])
    assert res.exit_code == 0, res.output
    assert "conditioning (the first frame's latent and the image context) is seeded noise" in res.output
    assert "weights: the video is noise" not in res.output
    inputs = json.loads((tmp_path / "real" / "report.json").read_text())["inputs"]
    assert inputs["weights"] == {"path": str(dit.resolve()), **file_digest(dit)}
    assert inputs["vae_weights"]["sha256"] == file_digest(tmp_path / "vae.pth")["sha256"]
    assert inputs["actions"] == "synthetic (seed 5)" and inputs["conditioning"] == "seeded noise (seed 5)"
    res = CliRunner().invoke(main, [*base, "--out", str(tmp_path / "random"), "--no-video"])
    assert res.exit_code == 0, res.output
    inputs = json.loads((tmp_path / "random" / "report.json").read_text())["inputs"]
    assert inputs["weights"] == "random (seed 5)" and inputs["vae_weights"] is None


def test_an_empty_folder_given_as_out_keeps_its_mode(tmp_path):
    """An empty folder is used as --out, but the output was swapped in with the usual mode: a private folder
    (0700, setgid) became readable by everyone."""
    out = tmp_path / "private"
    out.mkdir()
    out.chmod(0o2700)
    res = CliRunner().invoke(main, ["stream", "--config", "universal-small", "--blocks", "1", "--device", "cpu",
                                    "--out", str(out), "--no-video"])
    assert res.exit_code == 0, res.output
    assert (out / "report.json").is_file() and oct(out.stat().st_mode & 0o7777) == oct(0o2700)


def test_a_bad_vae_checkpoint_is_refused_before_the_dit_is_built(tmp_path, monkeypatch):
    """The decoder (and its --vae-weights) was built after the DiT: at full size a wrong VAE file was refused
    only once the DiT's checkpoint had loaded, though every argument is to be checked before the model is built."""
    import wan_trt.engines.stream as run
    from wan_trt.config_load import load_config
    from wan_trt.model import build_decoder
    from tests.model.test_vae import _write_vae_file

    def dit_built(*args, **kwargs):
        raise AssertionError("the DiT was built first")
    monkeypatch.setattr(run, "build_model", dit_built)
    _write_vae_file(build_decoder(load_config("universal-small")), tmp_path / "vae.pth",
                    **{"decoder.extra.weight": torch.zeros(1)})
    res = CliRunner().invoke(main, ["stream", "--config", "universal-small", "--blocks", "1", "--device", "cpu",
                                    "--vae-weights", str(tmp_path / "vae.pth"), "--out", str(tmp_path / "o")])
    assert res.exit_code == 1 and "--vae-weights" in res.output and "decoder.extra.weight" in res.output, res.output


def test_a_block_an_absurd_action_made_non_finite_names_its_actions(tmp_path):
    """A camera delta of 1e30 (which fp32 holds) made block 2 non-finite: the stream stopped naming the block and
    'the inputs' only. The error now says what the block's actions reach beside the blocks' before it."""
    from wan_trt.config_load import load_config
    keys = load_config("universal-small").model.action_config.keyboard_dim_in
    path = tmp_path / "actions.jsonl"
    path.write_text("".join(json.dumps({"mouse": [1e30 if b == 2 else 0.1, 0.0], "keyboard": [1] + [0] * (keys - 1)})
                            + "\n" for b in range(3)))
    res = CliRunner().invoke(main, ["stream", "--config", "universal-small", "--blocks", "3", "--actions", str(path),
                                    "--out", str(tmp_path / "s"), "--no-video"])
    assert res.exit_code == 1 and "block 2 came out non-finite" in res.output, res.output
    assert "block 2's actions: mouse up to 1e+30 in magnitude (the blocks before: 0.1); keyboard up to 1" in \
        res.output, res.output
    assert not (tmp_path / "s").exists()


def test_the_report_names_the_configs_every_field(tmp_path):
    """report.json named the config by name only: a config file of another model (2 layers) gave a report that told
    only its name apart from the preset's (a file under a preset's name is refused now)."""
    from wan_trt.config_load import PRESET_DIR, load_config
    data = json.loads((PRESET_DIR / "universal-small.json").read_text())
    data["model"]["num_layers"], data["name"] = 2, "two-layers"
    own = tmp_path / "two-layers.json"
    own.write_text(json.dumps(data))
    reports = {}
    for name, config in (("preset", "universal-small"), ("file", str(own))):
        res = CliRunner().invoke(main, ["stream", "--config", config, "--blocks", "1", "--no-video",
                                        "--out", str(tmp_path / name)])
        assert res.exit_code == 0, res.output
        reports[name] = json.loads((tmp_path / name / "report.json").read_text())["inputs"]["config"]
    assert reports["preset"] == load_config("universal-small").to_dict()
    assert reports["file"] == load_config(own).to_dict() != reports["preset"]


def test_an_input_file_rewritten_while_the_stream_ran_is_not_reported_as_read(tmp_path, monkeypatch):
    """The report hashed --weights, --vae-weights and --actions after the stream: a file rewritten meanwhile was
    recorded by its new sha256, another file than the one the stream ran on."""
    import wan_trt.engines.stream as stream_module
    from wan_trt.config_load import load_config
    keys = load_config("universal-small").model.action_config.keyboard_dim_in
    path = tmp_path / "actions.jsonl"
    path.write_text("".join(json.dumps({"mouse": [0.1, 0.0], "keyboard": [1] + [0] * (keys - 1)}) + "\n"
                            for _ in range(2)))
    real = stream_module.stream_blocks

    def rewritten_meanwhile(*args, **kwargs):  # the stream runs for real; the file changes while it does
        results = real(*args, **kwargs)
        path.write_text(path.read_text().replace("0.1", "0.2"))
        return results
    monkeypatch.setattr(stream_module, "stream_blocks", rewritten_meanwhile)
    res = CliRunner().invoke(main, ["stream", "--config", "universal-small", "--blocks", "2", "--actions", str(path),
                                    "--no-video", "--out", str(tmp_path / "s")])
    assert res.exit_code == 1 and "--actions" in res.output and "rewritten while the stream ran" in res.output, \
        res.output
    assert not (tmp_path / "s").exists()


_WRITE_PEAK = """
import resource, sys, torch
from wan_trt.video import write_mp4
frames = torch.empty((300, 352, 640, 3), dtype=torch.uint8)  # no transient larger than the frames
for i, frame in enumerate(frames):
    frame.copy_(torch.arange(640 * 3, dtype=torch.uint8).expand(352, -1).reshape(352, 640, 3) + i)
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
write_mp4(frames, sys.argv[1])
print((resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 - before) / frames.numel())
"""


def test_the_video_is_written_without_a_copy_of_its_frames(tmp_path):
    """write_mp4 padded the whole video into a copy before encoding it (and `stream --out` concatenated every
    block's frames first): a long stream's video, its largest output, was held two to three times over. Its peak
    memory now grows by the encoder's buffers, not by the frames' size (measured in a process of its own)."""
    import subprocess
    import sys
    from wan_trt.video import count_frames
    out = tmp_path / "v.mp4"
    run = subprocess.run([sys.executable, "-c", _WRITE_PEAK, str(out)], capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr
    assert float(run.stdout) < 0.75, run.stdout  # the frames' own size is 1.0
    assert count_frames(out) == 300


def test_frames_of_odd_size_and_in_blocks_are_written_in_order(tmp_path):
    """Blocks of frames are one video, in order; an odd size is padded by one pixel (H.264 needs even sizes)."""
    import av
    from wan_trt.video import write_mp4
    blocks = [torch.full((n, 33, 47, 3), 40 * i, dtype=torch.uint8) for i, n in enumerate((2, 3))]
    write_mp4(blocks, tmp_path / "v.mp4")
    with av.open(str(tmp_path / "v.mp4")) as container:
        got = [f.to_ndarray(format="rgb24") for f in container.decode(video=0)]
    assert [g.shape for g in got] == [(34, 48, 3)] * 5
    assert [round(float(g[:33, :47].mean()) / 40) for g in got] == [0, 0, 1, 1, 1]


def test_an_actions_file_with_a_byte_order_mark_says_how_to_save_it(tmp_path):
    """A file an editor saved as 'UTF-8 with BOM' was refused with Python's own hint, '(decode using utf-8-sig)',
    which is nothing a user of wan-trt can do; the refusal says how to save the file instead (the C++ reader
    refuses the same file: both read JSON lines as UTF-8 without one)."""
    line = json.dumps({"mouse": [0.1, 0.0], "keyboard": [1, 0, 0, 0]})
    path = tmp_path / "actions.jsonl"
    path.write_bytes(b"\xef\xbb\xbf" + (line + "\r\n").encode())
    res = CliRunner().invoke(main, ["stream", "--config", "universal-small", "--blocks", "1", "--actions", str(path)])
    assert res.exit_code == 1 and "line 1 (block 0): not JSON" in res.output, res.output
    assert "byte-order mark" in res.output and "without" in res.output and "utf-8-sig" not in res.output, res.output
