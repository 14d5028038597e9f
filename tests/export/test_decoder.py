"""The video decoder's graphs: spec, export, ONNX Runtime check, AOTInductor engines, bad input."""
from __future__ import annotations

import dataclasses
import json
import re
import shutil

import pytest
import torch
from click.testing import CliRunner

from wan_trt.cli import main
from wan_trt.config_load import load_config
from wan_trt.decoder_spec import CALLS, RGB, DecoderSpec
from wan_trt.engines.artifact import EngineMetadata
from wan_trt.engines.backends.torch import TorchRunner
from wan_trt.engines.bench import BenchOptions, run_bench
from wan_trt.engines.build import BuildOptions, build_engine
from wan_trt.engines.runtime.decoder import DecoderStream
from wan_trt.errors import WanTrtError
from wan_trt.export.decoder import export_decoder, read_decoder
from wan_trt.export.manifest import Manifest
from wan_trt.export.transformer import export_transformer
from wan_trt.graphs import spec_from_dict
from wan_trt.model import build_decoder, decoder_config
from wan_trt.model.vae import VideoDecoder
from wan_trt.validate.check import CheckOptions
from wan_trt.validate.check_decoder import check_target, decode_blocks, decode_whole_clip, stream_latents
from wan_trt.validate.metrics import error_stats

CFG = "universal-small"


def _runners(cfg, decoder, precision="fp32"):
    return [TorchRunner(decoder, DecoderSpec.from_config(cfg, precision, call)) for call in CALLS]


def test_spec_describes_both_calls_and_round_trips():
    cfg = load_config(CFG)
    first, steady = (DecoderSpec.from_config(cfg, "bf16", call) for call in CALLS)
    assert first.input_names == ["latents"] and len(steady.inputs) == 1 + len(steady.histories) == 33
    assert first.tensor(RGB).shape == (1, 3, 9, 32, 48) and steady.tensor(RGB).shape == (1, 3, 12, 32, 48)
    assert first.output_names == steady.output_names  # the first call leaves what the steady call takes
    with torch.device("meta"):
        layout = VideoDecoder(decoder_config(cfg)).history_shapes(1, 4, 6)
    assert layout[0] == (1, 16, 2, 4, 6) and layout[-1] == (1, 8, 2, 32, 48)  # conv1 ... the head at 8x
    channels_last = [(b, t, h, w, c) for b, c, t, h, w in layout]  # as graph I/O: [B, 2, h, w, C]
    assert [steady.tensor(i).shape for i, _ in steady.histories] == channels_last  # in call order
    assert [first.tensor(o).shape for _, o in first.histories] == channels_last
    for spec in (first, steady):
        assert spec_from_dict(json.loads(json.dumps(spec.to_dict()))).fingerprint() == spec.fingerprint()
    edited = steady.to_dict() | {"graph": "vocoder"}
    with pytest.raises(WanTrtError, match="vocoder"):
        spec_from_dict(edited)
    edited = steady.to_dict() | {"call": "first"}  # inputs no longer those of the call it claims
    with pytest.raises(WanTrtError, match="does not match"):
        spec_from_dict(edited)


def test_block_by_block_decode_equals_the_whole_clip_at_once():
    """8 blocks through the two graphs' static form, histories carried, against one decode of the whole
    clip (upstream's semantics); decoding every block as a stream's first (histories dropped) does not."""
    cfg = load_config(CFG)
    decoder = build_decoder(cfg, torch.float32, "cpu", seed=1)
    latents = stream_latents(DecoderSpec.from_config(cfg, "fp32"), 8, seed=3)
    whole = decode_whole_clip(decoder, latents)
    blocks = torch.cat(decode_blocks(*_runners(cfg, decoder), latents, cfg.block_frames), dim=2)
    assert blocks.shape == whole.shape == (1, 3, 9 + 12 * 7, 32, 48)
    assert error_stats(blocks, whole).max_abs < 2e-5
    first = DecoderSpec.from_config(cfg, "fp32", "first")
    with torch.no_grad():  # block 1 decoded as if it started a stream: its latent frames 4, 5 -> frames 13..20
        restarted = TorchRunner(decoder, first).infer({"latents": latents[:, :, 3:6]})[RGB]
    assert error_stats(restarted[:, :, 1:], whole[:, :, 13:21]).rel_l2 > 1e-2  # without its history it differs


@pytest.mark.parametrize("export, kind", [("decoder_export", "decoder"), ("tiny_decoder_export", "tiny-decoder")])
def test_onnx_export_passes_the_check_on_onnxruntime(export, kind, request):
    """Both graphs on ONNX Runtime, and 8 blocks through them (histories carried) against one decode of the whole
    clip in fp32 PyTorch; the Wan decoder and the tiny one."""
    decoder_export = request.getfixturevalue(export)
    manifests = read_decoder(decoder_export)
    assert {c: (m.spec.call, m.spec.KIND) for c, m in manifests.items()} == {c: (c, kind) for c in CALLS}
    res = CliRunner().invoke(main, ["check", str(decoder_export), "--blocks", "8", "--json"])
    assert res.exit_code == 0, res.output
    report = json.loads(res.output[res.output.index("{"):])
    assert report["ok"] and [o["output"] for o in report["single_pass"]] == ["first:rgb", "steady:rgb"]
    assert [b["video_frames"] for b in report["stream"]] == [9] + [12] * 7
    assert all(b["rel_l2"] < 1e-5 for b in report["stream"])


def test_a_bug_in_the_decoder_runtime_fails_the_check(decoder_export, monkeypatch):
    """A runtime that carries the histories through bf16 (in every decoder stream, as a bug of the runtime would
    be): the yardstick's blocks were decoded by the same stream code, erred as much and lent the engine twice
    that error, so an fp32 check passed at ~2e-3 where its floor is 1e-5."""
    from wan_trt.engines.runtime.decoder import DecoderStream
    carry = DecoderStream._decode

    def carried_in_bf16(self, latents, frames_of):
        frames = carry(self, latents, frames_of)
        for name, _ in self.spec.histories:
            self.feeds[name].copy_(self.feeds[name].to(torch.bfloat16))
        return frames

    monkeypatch.setattr(DecoderStream, "_decode", carried_in_bf16)
    report = check_target(decoder_export, CheckOptions(blocks=3, save_results=False))
    assert report.stream[0]["ok"] and not report.ok  # the first block reads no history
    assert all(not b["ok"] and b["allowed_rel_l2"] == 1e-5 for b in report.stream[1:]), report.stream


@pytest.mark.parametrize("args", [["--blocks", "1"], ["--blocks", "2"], ["--no-stream"]])
def test_a_decoder_check_that_would_leave_its_histories_unjudged_is_refused(decoder_export, args):
    """The single calls judge rgb only: the histories are judged by the stream where they are read, the first graph's
    in block 2 and the steady graph's own in block 3. With one block, or none, a decoder whose history outputs were
    all wrong passed its check; with two, one whose steady graph's were."""
    res = CliRunner().invoke(main, ["check", str(decoder_export), *args])
    assert res.exit_code == 1, res.output
    assert "histories" in res.output and "--blocks 3" in res.output, res.output


def test_a_steady_graph_whose_histories_are_wrong_fails_the_check(decoder_export, monkeypatch):
    """A steady graph writing zeros for every history (its frames right) passed a check of 2 blocks: nothing read what
    it wrote. The shortest check allowed streams 3 blocks and fails it."""
    decode = DecoderStream._decode

    def zero_steady_histories(self, *args, **kwargs):
        steady = self.started  # the steady graph runs this call
        frames = decode(self, *args, **kwargs)
        if steady:
            for name, _ in self.spec.histories:
                self.feeds[name].zero_()
        return frames

    monkeypatch.setattr(DecoderStream, "_decode", zero_steady_histories)
    report = check_target(decoder_export, CheckOptions(blocks=3, save_results=False))
    assert report.stream[0]["ok"] and report.stream[1]["ok"] and not report.stream[2]["ok"] and not report.ok


def test_a_decoder_check_streams_three_blocks_by_default_and_the_dit_eight(decoder_export):
    """The decoder's stream check compares its blocks with the whole clip decoded at once in fp32, whose activations
    at full size fill most of an 80 GB GPU at 3 blocks: its default was the DiT's 8, so `wan-trt check DEC` as the
    README gives it could not run at full size."""
    res = CliRunner().invoke(main, ["check", str(decoder_export), "--json", "--no-save-results"])
    assert res.exit_code == 0, res.output
    report = json.loads(res.output[res.output.index("{"):])
    assert report["options"]["blocks"] == 3 and [b["video_frames"] for b in report["stream"]] == [9, 12, 12]
    assert CheckOptions().as_run("pass").blocks == 8 and CheckOptions(blocks=5).as_run("decoder").blocks == 5


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (its memory limit is what is judged)")
def test_a_whole_clip_reference_the_gpu_cannot_hold_is_refused_naming_blocks():
    """The decoder check's whole-clip reference grows with --blocks; one the GPU could not hold ended in a
    traceback from the allocator."""
    cfg = load_config(CFG)
    decoder = build_decoder(cfg, torch.float32, "cuda", None, 0)
    latents = stream_latents(DecoderSpec.from_config(cfg, "fp32", "steady"), 200, seed=0)
    free, total = torch.cuda.mem_get_info()
    torch.cuda.set_per_process_memory_fraction((torch.cuda.memory_allocated() + (64 << 20)) / total)
    try:
        with pytest.raises(WanTrtError, match=r"does not fit in cuda:0's memory: pass fewer --blocks"):
            decode_whole_clip(decoder, latents)
    finally:
        torch.cuda.set_per_process_memory_fraction(1.0)


def test_a_whole_clip_reference_that_runs_out_of_memory_is_refused_naming_blocks():
    """The refusal's logic on any machine (the GPU test above runs the real allocator): an out-of-memory error of the
    whole-clip decode, here raised by the decoder standing in for the allocator, becomes a one-line error naming
    --blocks and the least the check takes."""
    cfg = load_config(CFG)
    decoder = build_decoder(cfg, torch.float32, "cpu", None, 0)

    def exhausted(*args, **kwargs):
        raise torch.OutOfMemoryError("out of memory (allocating the whole clip)")
    decoder.forward = exhausted
    latents = stream_latents(DecoderSpec.from_config(cfg, "fp32", "steady"), 3, seed=0)
    with pytest.raises(WanTrtError, match=r"that clip \(9 latent frames, float32\) does not fit in cpu's memory: pass "
                                          r"fewer --blocks \(at least 3\)"):
        decode_whole_clip(decoder, latents)


def test_a_decoder_stream_the_check_cannot_hold_is_refused_before_any_work(decoder_export):
    """--blocks 100000000000 died with a traceback from the allocator (the seeded latents of the whole clip)."""
    res = CliRunner().invoke(main, ["check", str(decoder_export), "--blocks", str(10 ** 11), "--no-save-results"])
    assert res.exit_code == 1 and isinstance(res.exception, SystemExit), res.exception  # no traceback
    assert "--blocks 100000000000: the stream check holds" in res.output, res.output
    assert "(the default is 3)" in res.output, res.output  # the decoder's own default


def test_a_plugins_decoder_engine_is_benched_under_its_own_backend_name(decoder_aoti, tmp_path):
    """A decoder engine built with --ops plugins is run and named by the registry's aoti-plugins entries,
    as the DiT's is, not as a plain AOTInductor package."""
    from wan_trt.engines.bench_decoder import engine_variants
    from tests.conftest import package_stand_in
    for call in ("first", "steady"):  # CPU packages standing in for ones with the fused norms (a GPU's)
        (tmp_path / call).mkdir()
        engine = package_stand_in(decoder_aoti.parent.parent / call / decoder_aoti.name,
                                  tmp_path / call / decoder_aoti.name, fused_kernel="_norm_silu_join_kernel")
    assert engine_variants(decoder_aoti, "cuda") == ["aoti", "aoti+cudagraph"]
    assert engine_variants(engine, "cpu") == ["aoti-plugins"]
    assert engine_variants(engine, "cuda") == ["aoti-plugins", "aoti-plugins+cudagraph"]
    latents = stream_latents(DecoderSpec.from_config(load_config(CFG), "fp32"), 1, seed=5)
    with DecoderStream.from_engine(engine, "aoti-plugins", "cpu") as stream:
        assert stream.decode(latents).shape == (9, 32, 48, 3)


def test_aoti_engines_build_check_stream_and_bench(decoder_export, decoder_aoti, plain_export, tmp_path):
    """`wan-trt build` on the decoder export builds both engines (the shared fixture built them; this
    build finds them up to date); `wan-trt check` of either passes; a DecoderStream over them equals
    the PyTorch decoder's frames; `wan-trt bench` times them, alone and end to end behind the DiT."""
    engine = build_engine(str(decoder_export), None, BuildOptions(backend="aoti", precision="fp32", device="cpu"))
    assert engine == decoder_aoti == decoder_export / "steady" / "engine_aoti_cpu.pt2"
    assert (decoder_export / "first" / engine.name).is_file()
    first = decoder_export / "first" / engine.name
    report = check_target(first, CheckOptions(blocks=8, save_results=False))
    assert report.ok and len(report.stream) == 8, report.table()
    # the engine asked for is the target, both that ran are named (the report named only the steady one)
    recorded = {c: EngineMetadata.read(decoder_export / c / engine.name).engine_file["sha256"] for c in ("first", "steady")}
    written = json.loads((decoder_export / "steady" / "check" / f"report_decoder-{engine.name}.json").read_text())
    for r in (report.as_dict(), written):
        assert r["target"] == str(first.resolve()) and r["engine_sha256"] == recorded["first"]
        assert r["engines"] == {c: {"path": str((decoder_export / c / engine.name).resolve()), "sha256": recorded[c]}
                                for c in ("first", "steady")}
        assert r["manifests"] == {str((decoder_export / c).resolve()): Manifest.read(decoder_export / c).sha256
                                  for c in ("first", "steady")}
    cfg = load_config(CFG)
    latents = stream_latents(DecoderSpec.from_config(cfg, "fp32"), 8, seed=5)
    with DecoderStream.from_engine(engine, "aoti", "cpu") as stream:
        frames = torch.cat([stream.decode(latents[:, :, i:i + 3]) for i in range(0, 24, 3)])
    reference = build_decoder(cfg, torch.float32, "cpu", seed=4)
    with DecoderStream(*_runners(cfg, reference)) as stream:
        expected = torch.cat([stream.decode(latents[:, :, i:i + 3]) for i in range(0, 24, 3)])
    assert frames.dtype == torch.uint8 and frames.shape == (93, 32, 48, 3)
    assert (frames.int() - expected.int()).abs().max() <= 1
    options = BenchOptions(backends=("torch-eager",), blocks=3, device="cpu", decoder=decoder_export,
                           decoder_engine=engine, end_to_end=("torch-eager",))
    report = run_bench(plain_export, options)
    assert list(report["decoder"]["rows"]) == ["aoti"] and report["decoder"]["flops_per_block"]["steady"] > 0
    e2e = report["end_to_end"]["torch-eager+decoder"]
    assert e2e["stage_ms"]["decode"] > 0 and len(e2e["block_ms_all"]) == 3
    assert e2e["block_ms"]["n"] == 1  # steady: after the decoder's two graphs have run (blocks 0 and 1)
    with pytest.raises(WanTrtError, match="--decoder-engine"):
        run_bench(plain_export, dataclasses.replace(options, decoder_engine=None))
    with pytest.raises(WanTrtError, match="static-cache backends"):  # the reference pipeline has no session
        run_bench(plain_export, dataclasses.replace(options, backends=("reference-eager",),
                                                    end_to_end=("reference-eager",)))
    lone = tmp_path / "lone" / "steady"
    lone.mkdir(parents=True)
    for name in (engine.name, engine.name + ".json"):
        shutil.copy(decoder_export / "steady" / name, lone / name)
    with pytest.raises(WanTrtError, match="other graph's engine"):
        check_target(lone / engine.name, CheckOptions(save_results=False))


def test_bad_decoder_exports_and_flags_are_refused(decoder_export, tmp_path):
    cfg = load_config(CFG)
    mixed = tmp_path / "mixed"
    shutil.copytree(decoder_export, mixed)
    shutil.rmtree(mixed / "steady")
    export_decoder(cfg, tmp_path / "other", "fp32", seed=9, onnx=False)  # its manifest is what is judged
    shutil.copytree(tmp_path / "other" / "steady", mixed / "steady")
    with pytest.raises(WanTrtError, match="different configs, precisions or weights"):
        read_decoder(mixed)
    with pytest.raises(WanTrtError, match="not a decoder export"):
        read_decoder(tmp_path)
    dit = tmp_path / "dit"
    dit.mkdir()
    (dit / "manifest.json").write_text("{}")
    with pytest.raises(WanTrtError, match="single-graph export"):
        export_decoder(cfg, dit, "fp32")
    for extra, message in ((["--ops", "plugins"], "drop --ops plugins"),
                           (["--weights", str(dit / "manifest.json")], "with --vae-weights, not --weights")):
        res = CliRunner().invoke(main, ["export", "--config", CFG, "--graph", "decoder", "--out",
                                        str(tmp_path / "x"), *extra])
        assert res.exit_code == 1 and message in res.output, res.output


def _decoder_seeds(out):
    return {call: m.weights["seed"] for call, m in read_decoder(out).items()}


def test_a_refused_decoder_re_export_leaves_both_graphs_as_they_were(tmp_path):
    """The two graphs were exported in turn, each folder checked when its turn came: with a user's file in
    steady/, a re-export replaced first/ and then refused steady/, leaving a pair of two different decoders."""
    out = tmp_path / "dec"
    export_decoder(load_config(CFG), out, "fp32", seed=4, onnx=False)
    (out / "steady" / "notes.txt").write_text("mine")
    res = CliRunner().invoke(main, ["export", "--config", CFG, "--graph", "decoder", "--precision", "fp32",
                                    "--no-onnx", "--seed", "5", "--out", str(out), "--overwrite"])
    assert res.exit_code == 1 and "notes.txt" in res.output, res.output
    assert _decoder_seeds(out) == {"first": 4, "steady": 4}


@pytest.mark.parametrize("graph", ["decoder", "dit"])
def test_an_export_refused_for_its_checkpoint_leaves_no_folder_it_made(tmp_path, graph):
    """A decoder export (or one into a folder not there yet) whose checkpoint was refused after its staging began
    left the --out folder it had made, empty: the decoder's OUT (it holds first/ and steady/), a DiT export's
    missing parent folders."""
    wrong = tmp_path / "wrong.pth"
    torch.save({"decoder.1.weight": torch.zeros(256, 16, 3, 3)}, wrong)  # neither a VAE nor a DiT checkpoint
    out = tmp_path / "new" / "deeper" / "out"
    flags = ["--graph", "decoder", "--vae-weights"] if graph == "decoder" else ["--weights"]
    res = CliRunner().invoke(main, ["export", "--config", CFG, "--no-onnx", "--out", str(out), *flags, str(wrong)])
    assert res.exit_code == 1 and "missing key(s)" in res.output, res.output
    assert sorted(p.name for p in tmp_path.iterdir()) == ["wrong.pth"]


def test_a_decoder_re_export_that_fails_midway_changes_neither_graph(tmp_path, monkeypatch):
    """A write that fails while the second graph is exported (a full disk, a kill) left the first replaced."""
    import errno

    import wan_trt.export.writer as writer
    out = tmp_path / "dec"
    export_decoder(load_config(CFG), out, "fp32", seed=4, onnx=False)
    real = writer._export_into

    def full_disk_on_steady(staging, spec, **kwargs):
        if spec.call == "steady":
            raise OSError(errno.ENOSPC, "No space left on device")
        return real(staging, spec, **kwargs)

    monkeypatch.setattr(writer, "_export_into", full_disk_on_steady)
    with pytest.raises(WanTrtError, match="No space left"):
        export_decoder(load_config(CFG), out, "fp32", seed=5, onnx=False, overwrite=True)
    assert _decoder_seeds(out) == {"first": 4, "steady": 4}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["dec"]  # no staging folders left


def test_a_narrow_decoder_exports_with_only_its_head_by_taps(tmp_path):
    """Every convolution with under 8 outputs took the head's taps form (27 slices and adds each): at vae_dim 2
    the graph held thousands of slices, and the ONNX exporter's optimizer ran for hours."""
    import subprocess
    import sys

    data = load_config(CFG).to_dict()
    data["name"], data["inference"]["vae_dim"] = "narrow", 2
    (tmp_path / "narrow.json").write_text(json.dumps(data))
    decoder = build_decoder(load_config(tmp_path / "narrow.json"), seed=0).use_engine_form()
    assert [m.taps for m in decoder.modules() if hasattr(m, "taps")].count(True) == 1
    cli = [sys.executable, "-m", "wan_trt.cli"]
    export = [*cli, "export", "--config", str(tmp_path / "narrow.json"), "--graph", "decoder", "--precision", "fp32",
              "--out", str(tmp_path / "decoder")]
    subprocess.run(export, check=True, timeout=240, capture_output=True)  # seconds where it hung
    check = subprocess.run([*cli, "check", str(tmp_path / "decoder"), "--blocks", "3"], timeout=240,
                           capture_output=True, text=True)
    assert check.returncode == 0, check.stdout + check.stderr


def test_a_decoder_check_of_an_export_replaced_while_it_ran_writes_no_report(decoder_export, tmp_path, monkeypatch):
    """`export --overwrite` of the decoder export a check was checking swapped new graphs in, and the check wrote
    its passing report into them (the DiT's check refused this; the decoder's did not). It now fails, writing
    nothing."""
    import wan_trt.validate.check_decoder as check_decoder
    export = tmp_path / "dec"
    shutil.copytree(decoder_export, export)
    real = check_decoder.decoder_stream_rows

    def replaced_meanwhile(*args, **kwargs):
        rows = real(*args, **kwargs)
        export_decoder(load_config(CFG), export, "fp32", seed=5, onnx=False, overwrite=True)
        return rows
    monkeypatch.setattr(check_decoder, "decoder_stream_rows", replaced_meanwhile)
    with pytest.raises(WanTrtError, match="replaced while the decoder was checked"):
        check_target(export, CheckOptions(blocks=3, save_results=False))
    assert not list(export.glob("*/check/report_*.json"))


@pytest.mark.parametrize("onnx", [True, False], ids=["graphs", "no-graphs"])
def test_a_decoder_check_of_an_export_replaced_before_its_graphs_ran_writes_no_report(decoder_export, tmp_path,
                                                                                       monkeypatch, onnx):
    """The decoder check took its folders' identities only once it had read and verified both manifests and made
    the graphs' runners: an `export --overwrite` in that window went unseen, and the check judged the new graphs
    by the old export's references and wrote its report into the new export. The identities are now taken before
    the manifests are read. Replaced by an export without ONNX graphs (`--no-onnx`), the check ended in a
    FileNotFoundError traceback for the model.onnx its runner went to read: a failure of a check whose folders
    were replaced meanwhile is now refused as that."""
    import wan_trt.engines.backends.onnxruntime as onnxruntime
    export = tmp_path / "dec"
    shutil.copytree(decoder_export, export)
    real = onnxruntime.check_runners

    def replaced_once_made(directory, *args, **kwargs):
        runners = real(directory, *args, **kwargs)
        if directory.name == "steady":  # both runners made
            export_decoder(load_config(CFG), export, "fp32", seed=5, onnx=onnx, overwrite=True)
        return runners
    monkeypatch.setattr(onnxruntime, "check_runners", replaced_once_made)
    with pytest.raises(WanTrtError, match="replaced while"):
        check_target(export, CheckOptions(blocks=3, save_results=False))
    assert not list(export.glob("*/check/report_*.json"))


def test_a_decoder_check_of_an_export_replaced_while_it_ran_leaves_no_run_results_in_it(decoder_export, tmp_path,
                                                                                      monkeypatch):
    """Each call's RunResults were put in place as soon as Polygraphy had run it, long before the check looked for
    replaced folders: a check of an export replaced before its single calls wrote no report but left RunResults
    of graphs that are not there in first/check/ and steady/check/ of the new export. They now stay in staging
    files, put in place only once both folders are found unreplaced, and removed otherwise."""
    import wan_trt.validate.check_decoder as check_decoder
    export = tmp_path / "dec"
    shutil.copytree(decoder_export, export)
    real, replaced = check_decoder.check_single_pass, []

    def replaced_first(*args, **kwargs):
        if not replaced:
            export_decoder(load_config(CFG), export, "fp32", seed=5, overwrite=True)
            replaced.append(True)
        return real(*args, **kwargs)
    monkeypatch.setattr(check_decoder, "check_single_pass", replaced_first)
    with pytest.raises(WanTrtError, match="replaced while the decoder was checked"):
        check_target(export, CheckOptions(blocks=3, save_results=True))
    assert not list(export.glob("*/check/run_results_*.json")) + list(export.glob("*/check/.run_results_*partial*"))
    assert not list(export.glob("*/check/report_*.json"))


def test_a_decoder_re_export_interrupted_between_its_two_swaps_is_refused_as_a_mixed_pair(decoder_export, tmp_path,
                                                                                          monkeypatch):
    """The decoder's two graphs are swapped into place one after the other: an interrupt between the two renames
    leaves one new graph beside one old one. That pair is never used as one decoder: every reader of a decoder
    export compares the two manifests (config, precision, weights) and refuses a mixed pair naming the fix."""
    import wan_trt.outputs as outputs
    export = tmp_path / "dec"
    shutil.copytree(decoder_export, export)
    swap, swapped = outputs._swap_into_place, []

    def interrupted_after_the_first(*args, **kwargs):
        if swapped:
            raise KeyboardInterrupt
        swap(*args, **kwargs)
        swapped.append(args[1])
    monkeypatch.setattr(outputs, "_swap_into_place", interrupted_after_the_first)
    with pytest.raises(KeyboardInterrupt):
        export_decoder(load_config(CFG), export, "fp32", seed=5, onnx=False, overwrite=True)
    assert len(swapped) == 1 and not list(export.glob(".*.partial-*"))  # one graph swapped, no staging left
    seeds = {call: Manifest.read(export / call).weights["seed"] for call in CALLS}
    assert sorted(seeds.values()) == [4, 5], seeds  # the mixed pair the interrupt left
    with pytest.raises(WanTrtError, match="different configs, precisions or weights; re-export both"):
        read_decoder(export)
    with pytest.raises(WanTrtError, match="re-export both"):
        check_target(export, CheckOptions(blocks=3, save_results=False))


def test_a_decoder_engine_runs_only_as_built(decoder_aoti, tmp_path):
    """DecoderStream.from_engine dropped its device (the engine ran where it was built, whatever was named, a
    device that does not exist too), ran a native engine under 'aoti-plugins', failed with a TypeError for a
    backend that runs no engine file, and decode() outside `with` failed with a TypeError."""
    for backend, device, message in (("aoti", "no-such-device", "is not a torch device"),
                                     ("aoti", "meta", "wan-trt runs on cpu or cuda"),
                                     ("aoti-plugins", "cpu", "built as aoti, not aoti-plugins"),
                                     ("torch-eager", "cpu", "'torch-eager' runs no engine file")):
        with pytest.raises(WanTrtError, match=message):
            DecoderStream.from_engine(decoder_aoti, backend, device)
    if torch.cuda.is_available():
        with pytest.raises(WanTrtError, match="built for cpu"):
            DecoderStream.from_engine(decoder_aoti, "aoti", "cuda")
    stream = DecoderStream.from_engine(decoder_aoti, "aoti", "cpu")
    latents = stream_latents(DecoderSpec.from_config(load_config(CFG), "fp32"), 1, seed=5)
    with pytest.raises(WanTrtError, match="the decoder is not active"):
        stream.decode(latents)
    with stream:
        assert stream.decode(latents).shape == (9, 32, 48, 3)
    with pytest.raises(WanTrtError, match="the decoder is not active"):  # and again once left
        stream.decode(latents)


@pytest.mark.parametrize("flags, expected, wrong", [
    (["--bf16", "--backend", "aoti", "--device", "cpu"],
     "`wan-trt export --config universal-small --graph decoder --precision bf16 --seed 4 --out DIR`", None),
    (["--fp32", "--backend", "tensorrt", "--ops", "plugins"], "no fused ops", "re-export"),
    (["--fp32", "--backend", "aoti", "--device", "cpu", "--seed", "5"],
     "`wan-trt export --config universal-small --graph decoder --precision fp32 --seed 5 --out ", None),
])
def test_a_decoder_build_refused_for_its_flags_says_how_to_make_the_decoder_it_asks_for(decoder_export, flags,
                                                                                        expected, wrong):
    """A build of a decoder export refused for its --precision advised `wan-trt export --precision P` (a DiT of the
    default config), for --seed an export without --graph decoder, and for TensorRT's --ops plugins a re-export,
    though the decoder's graphs have no fused ops whatever the export (its fused norms are an AOTInductor build's)."""
    res = CliRunner().invoke(main, ["build", str(decoder_export), *flags])
    assert res.exit_code == 1 and expected in res.output and (wrong is None or wrong not in res.output), res.output
    assert f"--out {decoder_export / 'first'}" not in res.output  # a DiT export there would break the pair


def test_a_dit_export_into_a_decoder_export_is_refused_as_such(decoder_export):
    """`export --out DEC --overwrite` of a DiT was refused as 'not a wan-trt export', listing wan-trt's own files."""
    res = CliRunner().invoke(main, ["export", "--config", CFG, "--no-onnx", "--out", str(decoder_export),
                                    "--overwrite"])
    assert res.exit_code == 1 and "holds a decoder export" in res.output and "not a wan-trt" not in res.output, \
        res.output
    read_decoder(decoder_export)


@pytest.mark.parametrize("call", CALLS)
def test_a_dit_export_into_one_graph_of_a_decoder_export_is_refused(tmp_path, call):
    """`export --out DEC/first --overwrite` of a DiT replaced that graph of the decoder export (and the engine and
    check reports beside it) with a DiT export, leaving a pair no command accepts; without --overwrite the refusal
    advised passing it."""
    out = tmp_path / "dec"
    export_decoder(load_config(CFG), out, "fp32", seed=4, onnx=False)
    for overwrite in ([], ["--overwrite"]):
        res = CliRunner().invoke(main, ["export", "--config", CFG, "--no-onnx", "--out", str(out / call),
                                        *overwrite])
        assert res.exit_code == 1 and f"is the {call} graph of the decoder export {out}" in res.output, res.output
        assert "pass --overwrite" not in res.output, res.output
    assert _decoder_seeds(out) == {"first": 4, "steady": 4}


@pytest.mark.parametrize("call", CALLS)
def test_a_dit_export_through_a_link_to_one_graph_of_a_decoder_export_is_refused(tmp_path, call):
    """The refusal above judged the path as typed: `--out LINK --overwrite`, LINK a symbolic link to DEC/first,
    replaced that graph with a DiT export, leaving a pair no command accepts."""
    out = tmp_path / "dec"
    export_decoder(load_config(CFG), out, "fp32", seed=4, onnx=False)
    link = tmp_path / "link"
    link.symlink_to(out / call)
    res = CliRunner().invoke(main, ["export", "--config", CFG, "--no-onnx", "--out", str(link), "--overwrite"])
    assert res.exit_code == 1 and f"is the {call} graph of the decoder export {out}" in res.output, res.output
    assert _decoder_seeds(out) == {"first": 4, "steady": 4}


@pytest.mark.parametrize("call", CALLS)
def test_a_decoder_export_over_a_dit_export_in_first_or_steady_is_refused(tmp_path, call):
    """`export --graph decoder --out DIR --overwrite`, where DIR/first (or DIR/steady) held a DiT export, replaced the
    DiT export (its engines and check reports with it) with one of the decoder's graphs; without --overwrite the
    refusal advised passing it."""
    out = tmp_path / "runs"
    export_transformer(load_config(CFG), out / call, "fp32", seed=7, onnx=False)
    before = (out / call / "manifest.json").read_bytes()
    for overwrite in ([], ["--overwrite"]):
        res = CliRunner().invoke(main, ["export", "--config", CFG, "--graph", "decoder", "--no-onnx", "--out",
                                        str(out), "--precision", "fp32", *overwrite])
        assert res.exit_code == 1 and f"{out / call} holds a DiT export" in res.output, res.output
        assert "pass --overwrite" not in res.output, res.output
    assert (out / call / "manifest.json").read_bytes() == before
    assert not (out / ("steady" if call == "first" else "first")).exists()


def test_a_decoder_stream_of_two_exports_graphs_is_refused(decoder_export, tmp_path):
    """`DecoderStream(first, steady)` compared the runners' graph kind, config, precision and device, not their
    weights: the first graph of one decoder export and the steady graph of another streamed frames of neither."""
    from wan_trt.engines.backends.onnxruntime import export_runner
    export_decoder(load_config(CFG), tmp_path / "other", "fp32", seed=9)
    first = export_runner(decoder_export / "first", Manifest.read(decoder_export / "first"), "cpu")
    steady = export_runner(tmp_path / "other" / "steady", Manifest.read(tmp_path / "other" / "steady"), "cpu")
    with pytest.raises(WanTrtError, match="runs weights .* its steady runner .* weights"):
        DecoderStream(first, steady)
    same = export_runner(decoder_export / "steady", Manifest.read(decoder_export / "steady"), "cpu")
    DecoderStream(first, same)


def test_the_benchs_pytorch_decoder_rows_refuse_non_finite_frames():
    """The bench's rows of PyTorch's decoder (upstream's way, fp16) threw the frames away: a decoder making NaN was a
    timing row like any other, where the engine rows refuse non-finite frames."""
    from wan_trt.engines.bench_decoder import reference_decode
    from wan_trt.engines.runtime.finite import NonFiniteFrames
    cfg = load_config(CFG)
    decoder = build_decoder(cfg, torch.float32, "cpu", None, 4)
    latents = stream_latents(DecoderSpec.from_config(cfg, "fp32", "steady"), 2, seed=0)
    decode = reference_decode(decoder, compile=False)
    decode(0, latents[:, :, :3])  # finite
    with torch.no_grad():  # NaN: an Inf the clamp to [-1, 1] would hide
        decoder.decoder.head[2].weight[0, 0, 0, 0, 0] = float("nan")
    with pytest.raises(NonFiniteFrames, match="non-finite .* in block 1"):
        decode(1, latents[:, :, 3:])


def _copied_pair(engine, to):
    """A copy in ``to``/first and ``to``/steady of the decoder engine pair of ``engine`` (engines, metadata, runtime
    files; the exports they were built from stay where they are)."""
    for call in CALLS:
        (to / call).mkdir(parents=True)
        for f in engine.parents[1].joinpath(call).glob(engine.name + "*"):
            shutil.copy(f, to / call / f.name)
    return to


def test_a_decoder_engine_pair_built_two_ways_is_refused(decoder_aoti, tmp_path):
    """A pair whose first engine was built otherwise than its steady one (another backend or ops under the same file
    name) ran, and its check's report named the steady engine's backend only. One `wan-trt build` of the decoder
    export builds both alike: a pair built two ways is refused (here the first engine's metadata says --ops plugins)."""
    from wan_trt.engines.runtime.decoder import paired_engines
    pair = _copied_pair(decoder_aoti, tmp_path / "pair")
    paired_engines(pair / "steady" / decoder_aoti.name)
    meta = pair / "first" / (decoder_aoti.name + ".json")
    meta.write_text(json.dumps({**json.loads(meta.read_text()), "ops": "plugins"}))
    with pytest.raises(WanTrtError, match=r"its two engines were built differently \(first: backend aoti-plugins, "
                                          r"steady: backend aoti\)"):
        paired_engines(pair / "steady" / decoder_aoti.name)


@pytest.mark.parametrize("field, value", [
    ("extra", {"layers": {"Convolution": 7}}),  # what TensorRT made of the graph: the two graphs differ
    ("versions", {"wan_trt": "0.0.1"}),  # an engine a later wan-trt reused (its key leaves wan-trt's version out)
])
def test_a_decoder_engine_pair_differing_in_what_is_no_build_option_is_taken(decoder_aoti, tmp_path, field, value):
    """The pair is compared by how it was built, not by what a build records beside: TensorRT's layer counts of each
    graph (a pair built by one `wan-trt build` has two) and the wan-trt version of an engine reused as built."""
    from wan_trt.engines.runtime.decoder import paired_engines
    pair = _copied_pair(decoder_aoti, tmp_path / "pair")
    meta = pair / "steady" / (decoder_aoti.name + ".json")
    data = json.loads(meta.read_text())
    meta.write_text(json.dumps({**data, field: {**data[field], **value}}))
    assert set(paired_engines(pair / "steady" / decoder_aoti.name)) == set(CALLS)


@pytest.mark.parametrize("field, value, named", [
    ("extra", {"opt_level": 5}, 'options {"opt_level": 5}'),  # a TensorRT option, say, given to one build only
    ("versions", {"torch": "0.0"}, 'versions {"torch": "0.0"}'),  # one engine rebuilt after an upgrade
])
def test_a_decoder_engine_pair_built_with_other_options_or_tools_is_refused(decoder_aoti, tmp_path, field, value,
                                                                           named):
    """The pair was compared by backend and device only: engines built by the same backend with other build options
    (`wan-trt build D/steady --opt-level 5` beside a pair built at 3) or by another version of the tools passed as one
    build's, and a check reported them as one."""
    from wan_trt.engines.runtime.decoder import paired_engines
    pair = _copied_pair(decoder_aoti, tmp_path / "pair")
    meta = pair / "steady" / (decoder_aoti.name + ".json")
    meta.write_text(json.dumps({**json.loads(meta.read_text()), field: value}))
    with pytest.raises(WanTrtError, match=r"its two engines were built differently \(first: (options|versions) .*, "
                                          r"steady: " + re.escape(named) + r"\)"):
        paired_engines(pair / "steady" / decoder_aoti.name)
