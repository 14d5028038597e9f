"""``wan-trt bench``: names checked before any work, named backends must run, failures are failures."""
import json
import shutil
import subprocess
import sys
import time

import pytest
from click.testing import CliRunner

from wan_trt.cli import main
from wan_trt.engines.backends import ALL_BACKENDS
from wan_trt.engines.bench import Bench, _bench_one, record_unprofiled


def _bench(args):
    return CliRunner().invoke(main, ["bench", *args])


def test_unknown_backend_is_refused_before_any_work(plain_export, tmp_path):
    out = tmp_path / "bench.json"
    res = _bench([str(plain_export), "--device", "cpu", "--backends", "torch-eagre", "--out", str(out)])
    assert res.exit_code == 1, res.output
    assert "unknown backend(s) 'torch-eagre'" in res.output and "torch-eager" in res.output
    assert "Traceback" not in res.output and not out.exists()  # nothing ran, nothing written


def test_a_backend_named_twice_is_refused_before_any_work(plain_export, tmp_path):
    """A backend named twice in --backends or --end-to-end ran twice and reported one row."""
    out = tmp_path / "b.json"
    for flags in (["--backends", "torch-eager,torch-eager"],
                  ["--backends", "torch-eager", "--end-to-end", "torch-eager,torch-eager"]):
        res = _bench([str(plain_export), "--device", "cpu", *flags, "--out", str(out)])
        assert res.exit_code == 1 and "'torch-eager' named twice" in res.output, res.output
        assert not out.exists()


def test_the_old_upstream_name_is_gone(plain_export):
    res = _bench([str(plain_export), "--device", "cpu", "--backends", "upstream-eager"])
    assert res.exit_code == 1 and "reference-eager" in res.output
    assert "upstream-eager" not in ALL_BACKENDS


def test_a_named_backend_that_cannot_run_fails_and_the_others_are_written(plain_export, tmp_path):
    out = tmp_path / "bench.json"
    res = _bench([str(plain_export), "--device", "cpu", "--blocks", "2", "--backends", "torch-eager,onnxruntime",
                  "--out", str(out)])
    assert res.exit_code == 1, res.output
    assert "1 row(s) failed: onnxruntime" in res.output and "no ONNX graph" in res.output
    report = json.loads(out.read_text())
    assert set(report["backends"]) == {"torch-eager"} and set(report["failed"]) == {"onnxruntime"}


def test_only_unavailable_backends_is_an_error(plain_export):
    res = _bench([str(plain_export), "--device", "cpu", "--backends", "tensorrt"])
    assert res.exit_code == 1 and "tensorrt" in res.output and "FAILED" in res.output, res.output


def test_default_set_skips_what_this_machine_cannot_run(plain_export):
    """Without --backends an unavailable backend is skipped with its reason, not failed."""
    report = {"backends": {}, "skipped": {}, "failed": {}}
    bench = Bench(plain_export, "cpu", {})
    _bench_one(report, "backends", "aoti", False, run=lambda: bench.run("aoti", 2))
    _bench_one(report, "backends", "onnxruntime", False, run=lambda: bench.run("onnxruntime", 2))
    assert set(report["skipped"]) == {"aoti", "onnxruntime"} and not report["failed"]
    assert "--aoti-engine" in report["skipped"]["aoti"]
    _bench_one(report, "backends", "aoti", True, run=lambda: bench.run("aoti", 2))
    assert "cannot run on this machine" in report["failed"]["aoti"]


def test_the_onnxruntime_row_runs_what_the_check_runs_and_not_reference_functions(tmp_path):
    """The bench refused every graph but fp32 on ONNX Runtime's CPU provider, where the runner (and the check) refuse
    bf16 only: an fp16 graph the check ran and passed was 'cannot run on this machine'. And it timed a --ops plugins
    graph, whose fused nodes ONNX Runtime runs as reference Python functions, as the graph's speed (20x the native
    graph's), with nothing in the report to say so: that row is skipped with the reason."""
    from wan_trt.config_load import load_config
    from wan_trt.export.transformer import export_transformer
    cfg = load_config("universal-small")
    export_transformer(cfg, tmp_path / "fp16", "fp16", seed=3)
    export_transformer(cfg, tmp_path / "plugins", "fp32", seed=3, ops="plugins")
    report = {"backends": {}, "skipped": {}, "failed": {}}
    fp16, plugins = Bench(tmp_path / "fp16", "cpu", {}), Bench(tmp_path / "plugins", "cpu", {})
    _bench_one(report, "backends", "onnxruntime", False, run=lambda: fp16.run("onnxruntime", 2))
    assert "onnxruntime" in report["backends"] and not report["skipped"] and not report["failed"], report
    report["backends"] = {}
    _bench_one(report, "backends", "onnxruntime", False, run=lambda: plugins.run("onnxruntime", 2))
    assert not report["backends"] and "reference Python functions" in report["skipped"]["onnxruntime"], report


def test_a_backend_that_raises_is_a_failure_with_its_traceback(plain_export, monkeypatch):
    report = {"backends": {}, "skipped": {}, "failed": {}}
    bench = Bench(plain_export, "cpu", {})

    def broken_infer(self, feeds):
        raise RuntimeError("kernel exploded")
    monkeypatch.setattr("wan_trt.engines.backends.torch.TorchRunner.infer", broken_infer)
    _bench_one(report, "backends", "torch-eager", False, run=lambda: bench.run("torch-eager", 2))
    assert "RuntimeError: kernel exploded" in report["failed"]["torch-eager"]
    assert "Traceback" in report["failed"]["torch-eager"] and not report["skipped"]


def test_a_profile_asked_of_a_row_that_failed_or_was_skipped_says_why_it_is_missing():
    """`--profile B` of a backend whose bench row failed or was skipped was dropped without a word: the report
    had no profile, no failure and nothing pending for it. It is now a failure naming why (the profiles
    themselves need CUDA)."""
    report = {"backends": {}, "skipped": {"tensorrt": "tensorrt is not installed"}, "failed": {"aoti": "Traceback"}}
    record_unprofiled(report, "aoti")
    record_unprofiled(report, "tensorrt")
    assert report["failed"]["profile aoti"] == "not profiled: its bench row failed (see its entry)"
    assert report["failed"]["profile tensorrt"] == "not profiled: its bench row was skipped (see its entry)"


def test_unwritable_out_fails_before_benchmarking(plain_export, tmp_path):
    afile = tmp_path / "afile"
    afile.write_text("x")
    res = _bench([str(plain_export), "--device", "cpu", "--backends", "torch-eager", "--out", str(afile / "b.json")])
    assert res.exit_code == 1 and res.output.startswith("error:") and "Traceback" not in res.output, res.output
    assert "afile" in res.output


def test_a_bad_device_is_one_error_line_before_any_work(plain_export, tmp_path):
    out = tmp_path / "bench.json"
    res = _bench([str(plain_export), "--device", "gpu0", "--backends", "torch-eager", "--out", str(out)])
    assert res.exit_code == 1 and "--device 'gpu0' is not a torch device" in res.output, res.output
    assert "Traceback" not in res.output and not out.exists()


def test_an_engine_of_another_export_is_benched_beside_the_runs_rows(plain_export, aoti, decoder_aoti, tmp_path):
    """--also-engine: the engine's rows, named BACKEND@PRECISION, in the same run and file (its CUDA-graph
    variant skipped off CUDA, with the reason); profiles take those names; engines that are not this
    config's denoising passes are refused before any work."""
    _, engine = aoti
    out = tmp_path / "bench.json"
    res = _bench([str(plain_export), "--device", "cpu", "--blocks", "2", "--backends", "torch-eager",
                  "--also-engine", str(engine), "--out", str(out)])
    assert res.exit_code == 0, res.output
    report = json.loads(out.read_text())
    assert set(report["backends"]) == {"torch-eager", "aoti@fp32"} and "aoti+cudagraph@fp32" in report["skipped"]
    row = report["backends"]["aoti@fp32"]
    assert row["precision"] == "fp32" and row["block_ms"]["n"] == 1 and row["export"] == str(aoti[0].resolve())
    assert "aoti@fp32" in res.output
    res = _bench([str(plain_export), "--device", "cpu", "--backends", "torch-eager", "--also-engine",
                  str(decoder_aoti), "--out", str(tmp_path / "x.json")])
    assert res.exit_code == 1 and "decoder engine" in res.output and not (tmp_path / "x.json").exists(), res.output
    res = _bench([str(plain_export), "--device", "cpu", "--backends", "torch-eager", "--also-engine", str(engine),
                  "--also-engine", str(engine)])
    assert res.exit_code == 1 and "rows named twice" in res.output, res.output
    for profile, message in (("aoti@fp32", "--device cuda"), ("aoti@fp16", "(torch-eager, aoti@fp32, aoti+cudagraph@fp32)")):
        res = _bench([str(plain_export), "--device", "cpu", "--backends", "torch-eager", "--also-engine", str(engine),
                      "--profile", profile])
        assert res.exit_code == 1 and message in res.output, res.output


def test_an_engine_whose_export_was_moved_with_it_is_benched_beside_the_runs_rows(plain_export, aoti, tmp_path):
    """--also-engine of an engine moved with its export (`mv out/uni16 out/uni16-v1`) was refused, "its export is
    gone; rebuild the engine", while the verified export lay beside it (check and --aoti-engine take it there)."""
    export, engine = aoti
    moved = tmp_path / "moved"
    shutil.copytree(export, moved)
    meta = moved / (engine.name + ".json")  # as `mv before moved` leaves it: built in a folder that is gone
    meta.write_text(json.dumps({**json.loads(meta.read_text()), "export_dir": str(tmp_path / "before")}))
    res = _bench([str(plain_export), "--device", "cpu", "--blocks", "2", "--backends", "torch-eager",
                  "--also-engine", str(moved / engine.name), "--out", str(tmp_path / "b.json")])
    assert res.exit_code == 0, res.output
    row = json.loads((tmp_path / "b.json").read_text())["backends"]["aoti@fp32"]
    assert row["export"] == str(moved)
    gone = tmp_path / "gone"
    gone.mkdir()
    shutil.copy(engine, gone)
    shutil.copy(engine.with_name(engine.name + ".json"), gone)
    meta = gone / (engine.name + ".json")
    meta.write_text(json.dumps({**json.loads(meta.read_text()), "export_dir": str(tmp_path / "nowhere")}))
    res = _bench([str(plain_export), "--device", "cpu", "--backends", "torch-eager", "--also-engine",
                  str(gone / engine.name)])
    assert res.exit_code == 1 and "the export it was built from is not found" in res.output, res.output


def test_overwrite_without_out_or_chart_is_refused_before_any_work(plain_export):
    """`bench --overwrite` without --out or --chart benched every row and wrote nothing for it to replace, without a
    word (`stream --overwrite` without --out is refused)."""
    res = _bench([str(plain_export), "--device", "cpu", "--backends", "torch-eager", "--overwrite"])
    assert res.exit_code == 1 and "--overwrite" in res.output and "--out or --chart" in res.output, res.output
    assert "bench torch-eager" not in res.output, res.output  # refused before any row ran


def test_out_and_chart_never_replace_a_file_bench_did_not_write(plain_export, tmp_path):
    """bench --out EXPORT/manifest.json wrote its report over the export's manifest, exit 0."""
    import shutil

    export = tmp_path / "export"
    shutil.copytree(plain_export, export)
    manifest = (export / "manifest.json").read_bytes()
    mine = tmp_path / "notes.png"
    mine.write_bytes(b"my picture")
    link = tmp_path / "link.json"
    link.symlink_to(tmp_path / "elsewhere.json")
    for flag, path, expected in (("--out", export / "manifest.json", "not a wan-trt bench report"),
                                 ("--chart", mine, "not a chart wan-trt bench drew"),
                                 ("--out", link, "symbolic link")):
        res = _bench([str(export), "--device", "cpu", "--blocks", "2", "--backends", "torch-eager", flag, str(path)])
        assert res.exit_code == 1 and res.output.startswith("error: ") and expected in res.output, res.output
        assert f"{flag} {path}" in res.output
    assert (export / "manifest.json").read_bytes() == manifest and mine.read_bytes() == b"my picture"
    assert link.is_symlink() and not (tmp_path / "elsewhere.json").exists()


def test_an_earlier_report_is_replaced_only_with_overwrite(plain_export, tmp_path):
    out, chart = tmp_path / "bench.json", tmp_path / "bench.png"
    args = [str(plain_export), "--device", "cpu", "--blocks", "2", "--backends", "torch-eager", "--out", str(out),
            "--chart", str(chart)]
    assert _bench(args).exit_code == 0
    first = out.read_bytes()
    res = _bench(args)
    assert res.exit_code == 1 and "--overwrite" in res.output and out.read_bytes() == first, res.output
    res = _bench(args + ["--overwrite"])
    assert res.exit_code == 0, res.output
    assert json.loads(out.read_text())["backends"].keys() == {"torch-eager"} and out.read_bytes() != first
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bench.json", "bench.png"]  # no staging files left
    # a run in which no row runs draws no chart: the earlier one went with the report it showed
    res = _bench(args[:-6] + ["--backends", "aoti", "--out", str(out), "--chart", str(chart), "--overwrite"])
    assert res.exit_code == 1 and json.loads(out.read_text())["backends"] == {}, res.output
    assert not chart.exists() and "removed the earlier chart" in res.output, res.output


def test_every_decoder_row_runs_or_says_why_not(plain_export, decoder_export, decoder_aoti, tmp_path):
    """--decoder on a CPU ran nothing and said nothing (rows {}, exit 0); an engine of another decoder export
    was benched under --decoder's name, precision and FLOPs."""
    from wan_trt.config_load import load_config
    from wan_trt.export.decoder import export_decoder

    base = [str(plain_export), "--device", "cpu", "--blocks", "3", "--backends", "torch-eager"]
    res = _bench(base + ["--decoder", str(decoder_export), "--out", str(tmp_path / "none.json")])
    assert res.exit_code == 1 and "--decoder-engine" in res.output and "CUDA" in res.output, res.output
    assert not (tmp_path / "none.json").exists()
    out = tmp_path / "bench.json"
    res = _bench(base + ["--decoder", str(decoder_export), "--decoder-engine", str(decoder_aoti), "--out", str(out)])
    assert res.exit_code == 0, res.output
    decoder = json.loads(out.read_text())["decoder"]
    assert set(decoder["rows"]) == {"aoti"}
    assert set(decoder["skipped"]) == {"reference-fp16-eager", "reference-fp16-compile",
                                       "reference-fp16-compile-cudnn-benchmark", "aoti+cudagraph"}
    assert all("CUDA" in why for why in decoder["skipped"].values())
    other = tmp_path / "other_decoder"
    export_decoder(load_config("universal-small"), other, "fp32", seed=9, onnx=False)
    res = _bench(base + ["--decoder", str(other), "--decoder-engine", str(decoder_aoti)])
    assert res.exit_code == 1 and f"--decoder {other}" in res.output and "built from another" in res.output, res.output


def test_the_same_file_for_out_and_chart_is_refused(plain_export, tmp_path):
    """bench --out X --chart X wrote the report, then the chart over it: exit 0, the report lost."""
    same = tmp_path / "same.out"
    res = _bench([str(plain_export), "--device", "cpu", "--blocks", "2", "--backends", "torch-eager", "--out",
                  str(same), "--chart", str(same)])
    assert res.exit_code == 1 and "--out and --chart" in res.output and not same.exists(), res.output


def test_an_engine_given_under_another_backends_flag_is_refused(aoti, tmp_path):
    """A native package given as --aoti-plugins-engine was benched and reported as aoti-plugins."""
    export, engine = aoti
    res = _bench([str(export), "--device", "cpu", "--blocks", "2", "--backends", "aoti-plugins",
                  "--aoti-plugins-engine", str(engine), "--out", str(tmp_path / "b.json")])
    assert res.exit_code == 1 and "--aoti-engine" in res.output and "--aoti-plugins-engine" in res.output, res.output
    assert not (tmp_path / "b.json").exists()


def test_a_report_saved_before_the_last_row_says_it_is_incomplete(plain_export, tmp_path, monkeypatch):
    """The report is saved after every row (a long run keeps what it measured), but one left by a killed run
    looked complete: no row pending, nothing skipped or failed."""
    import wan_trt.engines.bench as bench_module
    saved = []
    real = bench_module.write_file
    monkeypatch.setattr(bench_module, "write_file", lambda path, data: (saved.append(json.loads(data)),
                                                                         real(path, data)))
    out = tmp_path / "bench.json"
    res = _bench([str(plain_export), "--device", "cpu", "--blocks", "2", "--backends", "torch-eager,reference-eager",
                  "--out", str(out)])
    assert res.exit_code == 0, res.output
    assert [r["complete"] for r in saved] == [False] * (len(saved) - 1) + [True]
    assert saved[0]["pending"] == ["torch-eager", "reference-eager"] and saved[1]["pending"] == ["reference-eager"]
    assert json.loads(out.read_text()) == saved[-1] and saved[-1]["pending"] == []


def test_an_engine_no_benched_row_runs_and_a_chart_without_matplotlib_are_refused(aoti, tmp_path, monkeypatch):
    """--aoti-engine with --backends torch-eager was taken and never benched, and --chart without matplotlib wrote
    no chart: both exited 0."""
    import importlib.util
    export, engine = aoti
    res = _bench([str(export), "--device", "cpu", "--blocks", "2", "--backends", "torch-eager",
                  "--aoti-engine", str(engine), "--out", str(tmp_path / "b.json")])
    assert res.exit_code == 1 and "--backends has no aoti row" in res.output, res.output
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "matplotlib" else real(name, *a))
    res = _bench([str(export), "--device", "cpu", "--blocks", "2", "--backends", "torch-eager",
                  "--chart", str(tmp_path / "c.png")])
    assert res.exit_code == 1 and "needs matplotlib" in res.output, res.output
    assert not (tmp_path / "b.json").exists() and not (tmp_path / "c.png").exists()


def test_no_row_reports_a_warm_up_block_as_steady(plain_export, decoder_export, decoder_aoti, tmp_path):
    """With a decoder the first two blocks are warm-up (graphs captured in both): --blocks 2 timed none after
    them, and the decoder and end-to-end rows reported block 0 (9 frames, the capture) as their steady p50."""
    out = tmp_path / "bench.json"
    res = _bench([str(plain_export), "--device", "cpu", "--blocks", "2", "--backends", "torch-eager",
                  "--decoder", str(decoder_export), "--decoder-engine", str(decoder_aoti), "--out", str(out)])
    assert res.exit_code == 1 and "--blocks 3 or more" in res.output and "Traceback" not in res.output, res.output
    assert not out.exists()


def test_p50_is_the_median_and_only_timed_passes_give_ms_per_pass(plain_export, tmp_path):
    """p50 of an even count was the upper of the middle two samples (of two: the larger); the reference
    pipeline's ms/pass was its block time over four, printed as if measured."""
    from wan_trt.profiling import summarize_ms

    assert summarize_ms([1.0, 2.0, 3.0, 10.0])["p50"] == 2.5 and summarize_ms([4.0, 1.0, 9.0])["p50"] == 4.0
    out = tmp_path / "bench.json"
    res = _bench([str(plain_export), "--device", "cpu", "--blocks", "3", "--backends", "reference-eager,torch-eager",
                  "--out", str(out)])
    assert res.exit_code == 0, res.output
    rows = json.loads(out.read_text())["backends"]
    assert rows["reference-eager"]["ms_per_pass"] is None and rows["torch-eager"]["ms_per_pass"]["n"] > 0
    assert rows["torch-eager"]["block_ms"]["n"] == 2 and "(n 2)" in res.output


def test_a_result_file_names_the_device_that_ran_it(monkeypatch):
    """A CPU run on a machine with a GPU was recorded as run on the GPU (the environment took the current CUDA
    device whatever the run used)."""
    import torch

    from wan_trt.profiling import device_name, provenance

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "Some GPU")
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (9, 0))
    assert provenance("wan-trt", "cpu")["environment"]["device"] == device_name("cpu")
    assert provenance("wan-trt", "cuda")["environment"]["device"] == "Some GPU"


def test_an_earlier_report_stays_whole_until_the_new_one_is(plain_export, tmp_path, monkeypatch):
    """With --overwrite the first save replaced the earlier complete report: a run killed after it left only
    an incomplete one. Now its rows so far go beside it, and the report is replaced at the end."""
    import wan_trt.engines.bench as bench_module

    out = tmp_path / "bench.json"
    args = [str(plain_export), "--device", "cpu", "--blocks", "2", "--backends", "torch-eager,reference-eager",
            "--out", str(out)]
    assert _bench(args).exit_code == 0
    earlier = out.read_text()

    def killed(path, data):  # the run stops at its second save (after its first row)
        real(path, data)
        if json.loads(data)["pending"] == ["reference-eager"]:
            raise KeyboardInterrupt
    real = bench_module.write_file
    monkeypatch.setattr(bench_module, "write_file", killed)
    assert _bench(args + ["--overwrite"]).exit_code != 0
    progress = tmp_path / ".bench.json.incomplete"
    assert out.read_text() == earlier and json.loads(progress.read_text())["complete"] is False
    monkeypatch.setattr(bench_module, "write_file", real)
    assert _bench(args + ["--overwrite"]).exit_code == 0
    assert json.loads(out.read_text())["complete"] and not progress.exists()


def test_a_reference_row_whose_blocks_come_out_non_finite_fails(plain_export, monkeypatch):
    """The reference pipeline's row was timed and reported whatever its latents held (NaN in every block of a
    checkpoint that overflows), where the session's rows fail on a non-finite block."""
    import torch

    from wan_trt.pipeline import ReferencePipeline
    real = ReferencePipeline.run

    def nan_blocks(self, *args, **kwargs):
        for latents in real(self, *args, **kwargs):
            yield torch.full_like(latents, float("nan"))
    monkeypatch.setattr(ReferencePipeline, "run", nan_blocks)
    report = {"backends": {}, "skipped": {}, "failed": {}}
    bench = Bench(plain_export, "cpu", {})
    _bench_one(report, "backends", "reference-eager", False, run=lambda: bench.run("reference-eager", 2))
    assert "latents of block 0 came out non-finite" in report["failed"]["reference-eager"], report
    assert "reference-eager" not in report["backends"]


def test_overwrite_refuses_a_users_file_where_its_rows_so_far_would_go(plain_export, tmp_path):
    """A run that replaces an earlier report keeps its rows so far in .NAME.incomplete beside it: a file of the
    user's under that name was overwritten, then deleted at the end."""
    out = tmp_path / "bench.json"
    args = [str(plain_export), "--device", "cpu", "--blocks", "2", "--backends", "reference-eager", "--out", str(out)]
    assert _bench(args).exit_code == 0
    notes = tmp_path / ".bench.json.incomplete"
    notes.write_text("my notes")
    res = _bench(args + ["--overwrite"])
    assert res.exit_code == 1 and ".bench.json.incomplete" in res.output, res.output
    assert notes.read_text() == "my notes"


def _as_if_built_for(engine, device, into):
    """A copy of ``engine`` and its metadata in folder ``into``, the metadata saying it was built for ``device``."""
    import shutil

    into.mkdir(parents=True, exist_ok=True)
    copy = into / engine.name
    shutil.copy(engine, copy)
    meta = json.loads(engine.with_name(engine.name + ".json").read_text())
    copy.with_name(copy.name + ".json").write_text(json.dumps({**meta, "device": device}))
    return copy


def test_an_engine_built_for_another_device_is_refused_before_any_work(plain_export, aoti, decoder_export,
                                                                     decoder_aoti, tmp_path):
    """Its runner ran it on the device it was built for, while the report named --device (and measured that
    device's memory): a CPU package benched with --device cuda ran on the CPU under the GPU's name."""
    import shutil

    _, engine = aoti
    cuda_engine = _as_if_built_for(engine, "cuda", tmp_path / "cuda")
    out = tmp_path / "b.json"
    base = [str(plain_export), "--device", "cpu", "--blocks", "2", "--out", str(out)]
    for args, flag in ((["--backends", "aoti", "--aoti-engine", str(cuda_engine)], "--aoti-engine"),
                       (["--backends", "torch-eager", "--also-engine", str(cuda_engine)], "--also-engine")):
        res = _bench(base + args)
        assert res.exit_code == 1 and f"{flag} {cuda_engine}: built for cuda" in res.output, res.output
        assert "--device cpu" in res.output and "Traceback" not in res.output and not out.exists()
    decoder = tmp_path / "decoder"
    shutil.copytree(decoder_export, decoder)
    for call in ("first", "steady"):
        meta_file = decoder / call / (decoder_aoti.name + ".json")
        meta = json.loads(meta_file.read_text())
        meta_file.write_text(json.dumps({**meta, "device": "cuda", "export_dir": str((decoder / call).resolve())}))
    res = _bench(base + ["--backends", "torch-eager", "--decoder", str(decoder), "--decoder-engine",
                         str(decoder / "steady" / decoder_aoti.name)])
    steady = decoder / "steady" / decoder_aoti.name
    assert res.exit_code == 1 and f"--decoder-engine {steady}: built for cuda" in res.output, res.output
    assert not out.exists()


def test_an_engine_of_another_model_under_the_configs_name_is_refused(plain_export, aoti, tmp_path):
    """--also-engine compared config names only: an engine of a model with another FFN width, saved under the
    run's config name, was benched and named as a precision of the run's model."""
    from dataclasses import replace

    from wan_trt.config_load import load_config
    from wan_trt.export.manifest import Manifest
    from wan_trt.export.transformer import export_transformer

    cfg = load_config("universal-small")
    other = tmp_path / "other"
    export_transformer(replace(cfg, model=replace(cfg.model, ffn_dim=cfg.model.ffn_dim * 2)), other, "fp32", seed=2,
                       onnx=False)
    engine = _as_if_built_for(aoti[1], "cpu", other)  # its metadata pointed at the other model's export
    meta = engine.with_name(engine.name + ".json")
    meta.write_text(json.dumps({**json.loads(meta.read_text()), "export_dir": str(other.resolve()),
                                "manifest_sha256": Manifest.digest_at(other)}))
    out = tmp_path / "b.json"
    res = _bench([str(plain_export), "--device", "cpu", "--blocks", "2", "--backends", "torch-eager",
                  "--also-engine", str(engine), "--out", str(out)])
    assert res.exit_code == 1 and "model.ffn_dim" in res.output and "differs" in res.output, res.output
    assert not out.exists()


def test_an_end_to_end_row_without_its_dit_engine_is_refused_before_any_row(plain_export, decoder_export, decoder_aoti,
                                                                             tmp_path):
    """`--end-to-end aoti` without --aoti-engine was accepted: every other row ran first, then the end-to-end row
    failed for want of the engine."""
    out = tmp_path / "bench.json"
    res = _bench([str(plain_export), "--device", "cpu", "--blocks", "3", "--decoder", str(decoder_export),
                  "--decoder-engine", str(decoder_aoti), "--end-to-end", "aoti", "--out", str(out)])
    assert res.exit_code == 1 and "--end-to-end aoti: no --aoti-engine given" in res.output, \
        res.output
    assert "ms/block" not in res.output and not out.exists(), res.output


def test_an_end_to_end_rows_rate_counts_the_decoders_arithmetic(plain_export, decoder_export, decoder_aoti, tmp_path):
    """TFLOP/s of a DiT + decoder row divided the DiT's FLOPs alone by a block time that includes the decode."""
    out = tmp_path / "bench.json"
    res = _bench([str(plain_export), "--device", "cpu", "--blocks", "3", "--backends", "torch-eager",
                  "--decoder", str(decoder_export), "--decoder-engine", str(decoder_aoti),
                  "--end-to-end", "torch-eager", "--out", str(out)])
    assert res.exit_code == 0, res.output
    report = json.loads(out.read_text())
    row = report["end_to_end"]["torch-eager+decoder"]
    flops = report["flops_per_block"] + report["decoder"]["flops_per_block"]["steady"]
    assert row["tflops"] == flops / (row["block_ms"]["p50"] * 1e-3) / 1e12


def test_an_engine_of_one_gpu_is_refused_on_another(aoti, monkeypatch):
    """A package built for 'cuda' runs on the current GPU: benched with --device cuda:1 it ran on cuda:0 under
    cuda:1's name. A GPU named without an index is the current one."""
    import pytest
    import torch

    from wan_trt.engines.artifact import EngineMetadata
    from wan_trt.errors import WanTrtError

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)  # a machine whose current GPU is 0
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    meta = EngineMetadata.read(aoti[1])
    built_for_gpu = EngineMetadata(**{**meta.__dict__, "device": "cuda"})
    for device in ("cuda", "cuda:0"):
        built_for_gpu.check_runs_on(device, aoti[1], "--aoti-engine")
    with pytest.raises(WanTrtError, match=r"built for cuda \(cuda:0\), but this run is on --device cuda:1 \(cuda:1\)"):
        built_for_gpu.check_runs_on("cuda:1", aoti[1], "--aoti-engine")
    with pytest.raises(WanTrtError, match=r"built for cuda:1 \(cuda:1\), but this run is on --device cuda \(cuda:0\)"):
        EngineMetadata(**{**meta.__dict__, "device": "cuda:1"}).check_runs_on("cuda", aoti[1], "--aoti-engine")


def test_video_fps_counts_the_frames_a_block_of_the_config_makes(tmp_path):
    """Every row's fps was 12 frames over its block time, whatever the config: a config of 2 latent frames a
    block (8 video frames a steady block) was reported 1.5x as fast as it ran."""
    from wan_trt.config_load import load_config
    from wan_trt.export.transformer import export_transformer

    export = tmp_path / "export"
    export_transformer(load_config("universal-small").replace(num_frame_per_block=2), export, "fp32", seed=2,
                       onnx=False)
    out = tmp_path / "bench.json"
    res = _bench([str(export), "--device", "cpu", "--blocks", "2", "--backends", "torch-eager,reference-eager",
                  "--out", str(out)])
    assert res.exit_code == 0, res.output
    rows = json.loads(out.read_text())["backends"]
    for row in rows.values():
        steady = row["block_ms_all"][1:]
        assert row["video_fps"] == pytest.approx(8 / (sum(steady) / len(steady) / 1e3), rel=1e-12), row


def test_a_decoder_row_that_raises_is_a_failure_and_the_run_goes_on(plain_export, decoder_export, decoder_aoti,
                                                                    tmp_path, monkeypatch):
    """A decoder engine that raised ended the whole run with a traceback: the report kept no failure (failed {},
    the decoder pending), the end-to-end rows never ran, and no line said which row failed."""
    from wan_trt.engines.runtime.decoder import DecoderStream

    def broken_decode(self, latents):
        raise RuntimeError("kernel exploded")
    monkeypatch.setattr(DecoderStream, "decode", broken_decode)
    out = tmp_path / "bench.json"
    res = _bench([str(plain_export), "--device", "cpu", "--blocks", "3", "--backends", "torch-eager",
                  "--decoder", str(decoder_export), "--decoder-engine", str(decoder_aoti),
                  "--end-to-end", "torch-eager", "--out", str(out)])
    assert res.exit_code == 1 and res.output.splitlines()[-1].startswith("error: 2 row(s) failed: "), res.output
    assert "decoder aoti" in res.output.splitlines()[-1] and "torch-eager+decoder" in res.output.splitlines()[-1]
    report = json.loads(out.read_text())
    assert report["complete"] and report["pending"] == [] and set(report["backends"]) == {"torch-eager"}
    assert report["decoder"]["rows"] == {} and "aoti" in report["decoder"]["failed"]
    for row in ("decoder aoti", "torch-eager+decoder"):
        assert "RuntimeError: kernel exploded" in report["failed"][row] and "Traceback" in report["failed"][row]


def test_a_dit_engine_given_as_the_decoder_engine_is_refused_as_such(plain_export, tmp_path):
    """`--decoder-engine DIT/engine_aoti_cpu.pt2` said the decoder's 'other graph's engine' was missing in the
    DiT export's parent folder and advised `wan-trt build` of that folder, which is no export."""
    from wan_trt.config_load import load_config
    from wan_trt.export.decoder import export_decoder
    decoder = tmp_path / "dec"
    export_decoder(load_config("universal-small"), decoder, "fp32", onnx=False)
    dit = shutil.copytree(plain_export, tmp_path / "dit")
    engine = dit / "engine_aoti_cpu.pt2"  # where `wan-trt build DIT --backend aoti --device cpu` writes it: the
    engine.write_bytes(b"a DiT engine")   # refusal is the folder's, before the engine is read
    res = _bench([str(dit), "--device", "cpu", "--backends", "torch-eager", "--decoder", str(decoder),
                  "--decoder-engine", str(engine)])
    assert res.exit_code == 1 and f"decoder engine {engine}" in res.output, res.output
    assert "is not first/ or steady/ of a decoder export" in res.output, res.output
    assert f"wan-trt build {tmp_path}`" not in res.output, res.output


def test_a_second_bench_writing_the_same_report_fails_at_once(plain_export, tmp_path):
    """Two benches given one --out (and --overwrite) both wrote it: the rows of one run went into the other's
    progress file, and the report left was whichever finished last. The second now fails at once, as a second export
    to one folder does; the first runs on and writes its report."""
    out = tmp_path / "bench.json"
    args = [str(plain_export), "--device", "cpu", "--blocks", "16", "--backends", "torch-eager", "--out", str(out)]
    first = subprocess.Popen([sys.executable, "-m", "wan_trt.cli", "bench", *args], stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 120
        while not out.exists() and first.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)  # until its first save: it holds its lock and is benching
        assert first.poll() is None, first.stderr.read()
        res = _bench(args[:-6] + ["--blocks", "2", "--backends", "torch-eager", "--out", str(out), "--overwrite"])
        assert res.exit_code == 1 and "another wan-trt bench is writing" in res.output, res.output
    finally:
        _, err = first.communicate(timeout=300)
    assert first.returncode == 0, err
    assert json.loads(out.read_text())["blocks"] == 16 and json.loads(out.read_text())["complete"]
