"""The CLI's contract: user errors are one `error:` line and exit 1 (traceback only with -v)."""
import click
import pytest
import torch
from click.testing import CliRunner

from wan_trt.cli import main
from wan_trt.config_load import load_config
from wan_trt.export.transformer import export_transformer

NO_GPU = not torch.cuda.is_available()


def _run(args):
    return CliRunner().invoke(main, args)


def _one_error_line(res, *phrases):
    assert res.exit_code == 1, res.output
    assert isinstance(res.exception, SystemExit), res.exception  # no escaped exception: not a crash
    lines = [line for line in res.output.splitlines() if not line.startswith("[wan-trt]")]
    assert lines and lines[0].startswith("error: ") and "Traceback" not in res.output, res.output
    for phrase in phrases:
        assert phrase in res.output, (phrase, res.output)


@pytest.fixture(scope="module")
def bf16_export(tmp_path_factory):
    """What a default `wan-trt export` writes (bf16 graph), on the small config."""
    out = tmp_path_factory.mktemp("cli") / "bf16"
    export_transformer(load_config("universal-small"), out, "bf16", seed=0)
    return out


def test_default_check_of_a_default_export_on_cpu_says_what_to_do(bf16_export):
    _one_error_line(_run(["check", str(bf16_export)]), "bf16", "--provider cuda", "--precision fp32")


@pytest.mark.skipif(not NO_GPU, reason="this machine has a CUDA device: the no-GPU message is not reachable")
def test_check_with_cuda_provider_without_a_gpu(bf16_export):
    _one_error_line(_run(["check", str(bf16_export), "--provider", "cuda"]), "no CUDA device")


@pytest.mark.skipif(not NO_GPU, reason="this machine has a CUDA device: the no-GPU message is not reachable")
def test_check_of_a_bf16_graph_without_a_gpu_gives_advice_that_works(bf16_export):
    """`check BF16 --provider cuda` without a GPU advised `--provider cpu`, which then refused the bf16 graph."""
    res = _run(["check", str(bf16_export), "--provider", "cuda"])
    _one_error_line(res, "no CUDA device", "--precision fp32")
    assert "--provider cpu" not in res.output, res.output


def test_verbose_shows_the_traceback_of_a_user_error():
    res = _run(["-v", "info", "--config", "no-such-preset"])
    assert res.exit_code == 1 and "error: --config 'no-such-preset'" in res.output
    assert "Traceback" in res.output


@pytest.mark.parametrize("args, phrases", [
    (["check", "no/such/export"], ["'no/such/export' does not exist", "wan-trt check --help"]),
    (["export", "--config", "universal-small", "--opset", "7"], ["--opset", "wan-trt export --help"]),
    (["bench", ".", "--no-such-flag"], ["No such option", "--no-such-flag", "wan-trt bench --help"]),
    (["info", "--config"], ["'--config' requires an argument", "wan-trt info --help"]),
])
def test_what_click_refuses_is_one_error_line_too(args, phrases):
    """Click's own refusals (a path that does not exist, a value out of its choices, an unknown flag) printed a
    usage block and exited 2."""
    _one_error_line(_run(args), *phrases)


def test_one_graph_of_a_decoder_export_is_refused_by_name(decoder_export):
    """check DEC/steady was taken for a DiT export and crashed (KeyError 'timestep')."""
    _one_error_line(_run(["check", str(decoder_export / "steady")]), "one graph (steady) of the decoder export",
                    f"wan-trt check {decoder_export}")


def test_a_decoder_export_given_to_bench_says_where_it_goes(decoder_export):
    """bench DEC said it held no manifest.json, and bench DEC/steady failed its rows with an AttributeError."""
    for target in (decoder_export, decoder_export / "steady"):
        _one_error_line(_run(["bench", str(target), "--device", "cpu", "--backends", "torch-eager"]),
                        f"--decoder {decoder_export}")


def test_help_and_no_command_show_the_help_and_succeed():
    for args in ([], ["--help"], ["info", "--help"]):
        res = _run(args)
        assert res.exit_code == 0 and "Usage: wan-trt" in res.output and "error" not in res.output, (args, res.output)


@pytest.mark.parametrize("args, flag", [
    (["stream", "--config", "universal-small", "--blocks", "1", "--actions", ""], "--actions"),
    (["stream", "--config", "universal-small", "--blocks", "1", "--out", ""], "--out"),
    (["stream", "--config", "universal-small", "--blocks", "1", "--vae-weights", ""], "--vae-weights"),
    (["export", "--config", "universal-small", "--no-onnx", "--out", ""], "--out"),
    (["bench", ".", "--out", ""], "--out"),
    (["bench", ".", "--chart", ""], "--chart"),
])
def test_an_empty_path_is_refused_not_taken_for_none(args, flag):
    """`--actions ""` (an unset shell variable) streamed synthetic actions and `--out ""` wrote nothing, exit 0."""
    _one_error_line(_run(args), flag, "empty path")


@pytest.mark.parametrize("seed", ["-1", str(2 ** 32), "99999999999999999999"])
@pytest.mark.parametrize("command", ["stream", "build"])
def test_a_seed_out_of_range_is_refused_before_any_work(seed, command, tmp_path, monkeypatch):
    """A seed past int64 / 1000003 overflowed inside the noise source (a traceback, after the model was built);
    `build --config --seed -1` exported and built with seed -1, and a seed past int64 ended in a traceback."""
    monkeypatch.chdir(tmp_path)  # build --config exports into ./out
    args = {"stream": ["stream", "--config", "universal-small", "--blocks", "1"],
            "build": ["build", "--config", "universal-small", "--backend", "aoti", "--device", "cpu",
                      "--precision", "fp32"]}[command]
    _one_error_line(_run(args + ["--seed", seed]), "--seed")
    assert not list(tmp_path.iterdir())


def test_a_provider_given_with_an_engine_is_refused(aoti):
    """--provider applies to an export's ONNX graph: with an engine it was ignored and recorded in the report
    as if the engine had run on it."""
    _, engine = aoti
    _one_error_line(_run(["check", str(engine), "--provider", "cuda", "--no-save-results"]),
                    "--provider cuda", "an engine", "drop --provider")


def test_sigterm_cleans_up_as_ctrl_c_does(tmp_path):
    """`timeout` or `kill` (SIGTERM) ended a run at once: an export killed while it wrote left its staging folder
    and lock beside --out, for the next run of that --out to find. It is now handled as Ctrl-C: removed on the
    way out, exit status 143 (128 + SIGTERM)."""
    import signal
    import subprocess
    import sys
    import time
    out = tmp_path / "exp"
    run = subprocess.Popen([sys.executable, "-m", "wan_trt.cli", "export", "--config", "universal-small",
                            "--precision", "fp32", "--out", str(out)], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 120
    while not list(tmp_path.glob(".exp.partial-*")) and run.poll() is None and time.monotonic() < deadline:
        time.sleep(0.02)
    assert list(tmp_path.glob(".exp.partial-*")), "the export never staged (or ended first)"
    run.send_signal(signal.SIGTERM)
    _, err = run.communicate(timeout=120)
    assert run.returncode == 143 and b"error: terminated" in err, err
    assert not [p.name for p in tmp_path.iterdir()], "left behind"


def test_the_sigterm_handler_is_the_command_lines_alone():
    """The handler was installed by the command group and never removed: a process that ran a command as a
    library call (a test, a notebook, a service) was interrupted by a SIGTERM long after, instead of ending. It
    is in place only while a command runs from the command line, and the default comes back after."""
    import signal
    before = signal.getsignal(signal.SIGTERM)
    res = CliRunner().invoke(main, ["info", "--config", "universal-small"])
    assert res.exit_code == 0, res.output
    assert signal.getsignal(signal.SIGTERM) is before


def _single_valued_options():
    """(command, option) for every option of every command (and of the group) that takes one value."""
    commands = [(None, main), *((name, command) for name, command in main.commands.items())]
    return [(name, param) for name, command in commands for param in command.params
            if isinstance(param, click.Option) and not param.multiple and not param.count and param.name != "help"
            and not param.is_flag]


@pytest.mark.parametrize("name, option", _single_valued_options(),
                         ids=lambda x: x if isinstance(x, str) or x is None else x.opts[-1])
def test_every_single_valued_option_given_twice_is_refused(name, option, tmp_path, monkeypatch):
    """`--out a --out b` (or `--config x --config y`, `--precision` ...) went on with the last one and said nothing."""
    monkeypatch.chdir(tmp_path)
    flag = option.opts[-1]
    twice = [flag, "a", flag, "b"]
    takes_config = name is not None and "config_name" in {p.name for p in main.commands[name].params}
    stop = ["--config", "no-such-preset"] if takes_config and option.name != "config_name" else []  # no work if taken
    args = twice + ["info"] if name is None else [name, *twice, *stop]
    _one_error_line(_run(args), f"error: {flag} given twice (a, b): give it once")


def test_an_option_given_twice_is_refused_before_any_work(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    res = _run(["stream", "--config", "universal-small", "--blocks", "1", "--out", "a", "--out", "b"])
    _one_error_line(res, "error: --out given twice (a, b): give it once", "wan-trt stream --help")
    assert not list(tmp_path.iterdir())


@pytest.mark.parametrize("args, message", [
    (["stream", "--config", "no-such-preset", "--out", "o", "--video", "--no-video"],
     "--video and --no-video given together: give one of them"),
    (["build", "--bf16", "--fp16"], "--bf16 and --fp16 given together: give one of them"),
    (["build", "--fp16", "--bf16", "--fp16"], "--fp16 and --bf16 given together"),
    (["info", "--config", "x", "--config=y", "--config", "z"], "--config given 3 times (x, y, z): give it once"),
])
def test_the_two_spellings_of_an_option_count_as_giving_it_twice(args, message):
    _one_error_line(_run(args), f"error: {message}")


@pytest.mark.parametrize("args", [["-v", "-v", "info", "--list"], ["-vv", "info", "--list"],
                                  ["-v", "--verbose", "info", "--list"], ["info", "--list", "--json", "--json"]])
def test_a_flag_repeated_as_itself_means_it_once(args):
    """`-vv` and `--json --json` mean what one does (nothing to choose between); a --x with --no-x is refused."""
    res = _run(args)
    assert res.exit_code == 0 and "universal" in res.output, res.output


def test_an_option_meant_to_repeat_may_repeat(tmp_path):
    """bench --also-engine is repeatable: each one is taken (here refused as missing, not as repeated)."""
    res = _run(["bench", str(tmp_path), "--also-engine", "no/a.pt2", "--also-engine", "no/b.pt2"])
    _one_error_line(res, "'no/a.pt2' does not exist")
    assert "given twice" not in res.output


def test_different_options_with_one_meaning_are_not_a_repeat():
    """--precision fp32 with --fp32 agree: two options, each given once (pick_precision judges them)."""
    res = _run(["build", "--precision", "fp32", "--fp32"])
    _one_error_line(res, "give an export DIRECTORY")


@pytest.mark.parametrize("given, phrase", [(["--blocks", "5"], "--blocks sets"), (["--seed", "7"], "--seed sets"),
                                           (["--blocks", "5", "--seed", "7"], "--blocks and --seed set")])
def test_check_refuses_stream_options_that_no_stream_would_drop(exports, tmp_path, given, phrase):
    """`check --no-stream --blocks 5 --seed 7` passed and recorded blocks 5 and seed 7 in its report, though no
    stream ran to use them."""
    import shutil
    export = shutil.copytree(exports["universal-small"], tmp_path / "export")  # a check writes its report there
    _one_error_line(_run(["check", str(export), "--no-stream", *given, "--no-save-results"]), phrase,
                    "--no-stream skips")
    assert not (export / "check").exists()


@pytest.mark.parametrize("name", ["model.onnx", "sample_inputs.safetensors", "manifest.json"])
def test_check_of_a_file_of_an_export_points_at_the_export(exports, decoder_export, name):
    """`check EXPORT/model.onnx` said the file "was not built by `wan-trt build`; rebuild it": an engine build
    was never what was wanted. It names the export (a decoder's whole export for one of its graphs) to check."""
    export = exports["universal-small"]
    _one_error_line(_run(["check", str(export / name)]), f"{export / name} is a file of the export {export}",
                    f"`wan-trt check {export}`")
    _one_error_line(_run(["check", str(decoder_export / "steady" / name)]), f"`wan-trt check {decoder_export}`")
    assert "rebuild" not in _run(["check", str(export / name)]).output


@pytest.mark.parametrize("flag", [["--opset", "18"], ["--ops", "plugins"]])
def test_export_refuses_a_graph_option_with_no_onnx(tmp_path, flag):
    """`export --no-onnx --opset 18` exported and recorded opset 18 in its manifest, for a graph it did not write;
    `--ops plugins` likewise (an engine's fused ops are `build --ops`: a later build made a native engine)."""
    out = tmp_path / "e"
    _one_error_line(_run(["export", "--config", "universal-small", "--precision", "fp32",
                          "--no-onnx", *flag, "--out", str(out)]), " ".join(flag), "--no-onnx")
    assert not out.exists()


def test_a_file_that_is_no_engine_is_refused_saying_what_to_give(plain_export, tmp_path):
    """`inspect E.json` (the metadata beside an engine), `inspect EXPORT/manifest.json` or any file of the user's were
    each said to have been "not built by `wan-trt build`; rebuild it": no build makes an engine of them."""
    from wan_trt.config_load import load_config
    from wan_trt.export.decoder import export_decoder
    decoder_export = tmp_path / "dec"
    export_decoder(load_config("universal-small"), decoder_export, "fp32", onnx=False)
    engine = tmp_path / "engine_aoti_cpu.pt2"
    engine.write_bytes(b"an engine")
    (tmp_path / "engine_aoti_cpu.pt2.json").write_text("{}")
    res = _run(["inspect", str(tmp_path / "engine_aoti_cpu.pt2.json")])
    _one_error_line(res, f"is the metadata of the engine {engine}", f"give {engine}")
    assert "rebuild" not in res.output, res.output
    for export in (plain_export, decoder_export / "steady"):
        res = _run(["inspect", str(export / "manifest.json")])
        whole = decoder_export if export.name == "steady" else plain_export
        _one_error_line(res, f"is a file of the export {whole}", f"`wan-trt build {whole}`")
        assert "rebuild" not in res.output, res.output
    notes = tmp_path / "notes.txt"
    notes.write_text("mine")
    for command in (["inspect"], ["check"]):
        res = _run([*command, str(notes)])
        _one_error_line(res, "not built by `wan-trt build`", "give an engine file `wan-trt build` wrote")
        assert "rebuild it" not in res.output, res.output


@pytest.mark.parametrize("name", ["e.pt2", "a.b", "x"])
def test_a_file_with_a_short_name_that_is_no_engine_is_refused_not_a_crash(tmp_path, name):
    """`inspect e.pt2` (a copied engine without its metadata; any name of 5 characters or fewer) crashed with a
    ValueError traceback while the refusal was worded."""
    engine = tmp_path / name
    engine.write_bytes(b"an engine")
    for command in (["inspect"], ["check"]):
        _one_error_line(_run([*command, str(engine)]), f"engine {engine} has no {name}.json beside it")


def test_an_export_directory_that_is_missing_or_a_file_is_refused_as_such(plain_export, tmp_path):
    """`build out/typo` said the folder "holds no manifest.json", and `Manifest.read(EXPORT/manifest.json)` that the
    file held none: neither said that the path was missing or a file, nor how to make an export."""
    from wan_trt.errors import WanTrtError
    from wan_trt.export.manifest import Manifest
    missing = tmp_path / "typo"
    res = _run(["build", str(missing), "--backend", "aoti", "--device", "cpu"])
    _one_error_line(res, f"{missing} does not exist", "`wan-trt export")
    assert "holds no" not in res.output and not missing.exists(), res.output
    with pytest.raises(WanTrtError, match=f"{plain_export / 'manifest.json'} is a file, not an export directory; "
                                          f"give its folder {plain_export}"):
        Manifest.read(plain_export / "manifest.json")
    (tmp_path / "mine").mkdir()
    with pytest.raises(WanTrtError, match="holds no manifest.json: not a finished `wan-trt export` directory; make "
                                          "one with `wan-trt export"):
        Manifest.read(tmp_path / "mine")


@pytest.mark.parametrize("args, phrase", [
    (["check", ""], "TARGET"), (["inspect", ""], "ENGINE"), (["bench", ""], "DIRECTORY"),
    (["info", "--config", ""], "--config"), (["export", "--config", "", "--out", "x"], "--config"),
])
def test_an_empty_argument_or_config_is_refused_with_advice_that_applies(args, phrase, tmp_path, monkeypatch):
    """`check ""` was told to 'leave the option out', which a required argument cannot be, and `--config ""` was
    said to be 'a folder without a config.json' (the empty path reads as the current folder)."""
    monkeypatch.chdir(tmp_path)
    res = _run(args)
    _one_error_line(res, phrase, "empty")
    assert "leave the option out" not in res.output and "a folder without" not in res.output, res.output
    assert not list(tmp_path.iterdir())


def test_a_check_without_its_stream_says_so_where_it_says_passed(exports, tmp_path):
    """`check --no-stream` printed 'check onnxruntime-cpu: passed' and a table without a word of the stream check it
    had skipped; the same line and table follow a check that ran both."""
    import shutil
    export = shutil.copytree(exports["universal-small"], tmp_path / "export")  # a check writes its report there
    res = _run(["check", str(export), "--no-stream", "--no-save-results"])
    assert res.exit_code == 0, res.output
    passed = [line for line in res.output.splitlines() if ": passed" in line]
    assert passed and "stream check not run (--no-stream)" in passed[0], res.output
    assert res.output.rstrip().splitlines()[-1].startswith("stream"), res.output


def test_a_check_without_its_stream_records_no_stream_settings(exports, tmp_path):
    """`check --no-stream` recorded `"blocks": 8` and `"seed": 0` in its report (and in `--json`): the settings of a
    stream it did not run, where its log line and table say the stream check was not run."""
    import json
    import shutil
    export = shutil.copytree(exports["universal-small"], tmp_path / "export")  # a check writes its report there
    res = _run(["check", str(export), "--no-stream", "--no-save-results", "--json"])
    assert res.exit_code == 0, res.output
    written = json.loads((export / "check" / "report_onnxruntime-cpu.json").read_text())
    for report in (json.loads(res.stdout), written):
        assert report["options"]["stream"] is False and report["stream"] == [], report["options"]
        assert report["options"]["blocks"] is None and report["options"]["seed"] is None, report["options"]
