"""The Makefile's clean target removes what the README's two commands made, nothing else.

Each test runs a copy of the Makefile and the package in a folder of its own (the Makefile's environment lies
beside it: run from the checkout, `make clean` would remove the environment the tests run in)."""
import json
import shutil
import subprocess
from pathlib import Path

import pytest

from wan_trt.outputs import MARKER, marker_text
from wan_trt.owned import BENCH_REPORT_KEYS, FORMAT, STREAM_REPORT_KEYS

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.skipif(shutil.which("make") is None, reason="make is not installed")


def _checkout(folder: Path) -> Path:
    """``folder`` holding a copy of the Makefile and the package (no environment)."""
    shutil.copytree(ROOT / "wan_trt", folder / "wan_trt", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(ROOT / "Makefile", folder / "Makefile")
    return folder


def _make_clean(cwd: Path, *args: str, makefile: Path | None = None) -> subprocess.CompletedProcess:
    """`make clean` of ``makefile`` (default: cwd's) run in ``cwd`` (where out/demo lies)."""
    command = ["make", "-s", *(["-f", str(makefile)] if makefile else []), "clean", *args]
    return subprocess.run(command, cwd=cwd, capture_output=True, text=True)


def _export(folder: Path) -> list[Path]:
    """The files of an export as `wan-trt export` lays it out (a manifest naming its graph and inputs)."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / MARKER).write_text(marker_text("export"))
    (folder / "manifest.json").write_text(json.dumps({"format": FORMAT, "graph": "model.onnx",
                                                      "external_data": None, "sample_inputs": "in.safetensors"}))
    for name in ("model.onnx", "in.safetensors"):
        (folder / name).write_text("x")
    return [folder / n for n in (MARKER, "manifest.json", "model.onnx", "in.safetensors")]


def _stream(folder: Path) -> list[Path]:
    """The files of a stream output (its report counting the video's frames, its video)."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / MARKER).write_text(marker_text("stream output"))
    report = {k: None for k in STREAM_REPORT_KEYS} | {"summary": {"video_frames": 9}}
    (folder / "report.json").write_text(json.dumps(report))
    (folder / "video.mp4").write_text("x")
    return [folder / n for n in (MARKER, "report.json", "video.mp4")]


def _bench_report(path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({k: {} for k in BENCH_REPORT_KEYS}))
    return path


def _write(paths: list[Path]) -> None:
    for path in paths:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("x")


def test_make_clean_removes_the_demo_and_the_environment_not_a_users_outputs(tmp_path):
    """`make clean` ran `rm -rf .venv out`: every export, engine and result a user had put under out/ (where the
    README's examples put them) went with the demo's."""
    work = _checkout(tmp_path)
    ours = _export(work / "out/demo/export") + _stream(work / "out/demo/stream") + [
        _bench_report(work / "out/demo/bench.json")]
    theirs = [work / p for p in ("out/uni/engine_aoti_plugins_cuda.pt2", "out/my_notes.txt")]
    _write(theirs + [work / ".venv/bin/python"])
    run = _make_clean(work)
    assert run.returncode == 0, run.stdout + run.stderr
    assert not any(p.exists() for p in ours) and not (work / ".venv").exists() and not (work / "out/demo").exists()
    assert all(p.read_text() == "x" for p in theirs)


def test_make_clean_keeps_a_users_files_inside_the_demos_folders(tmp_path):
    """`make clean` removed a folder holding wan-trt's marker whatever else it held: notes and results a user had put
    in out/demo/export or out/demo/stream went with it. It removes what wan-trt wrote there and keeps the rest."""
    work = _checkout(tmp_path)
    ours = _export(work / "out/demo/export") + _stream(work / "out/demo/stream")
    theirs = [work / p for p in ("out/demo/export/NOTES.md", "out/demo/export/mine/results.csv",
                                 "out/demo/stream/holiday.mp4")]
    _write(theirs)
    run = _make_clean(work, f"VENV={tmp_path / 'venv'}")
    assert run.returncode == 0, run.stdout + run.stderr
    assert all(p.read_text() == "x" for p in theirs), [p for p in theirs if not p.exists()]
    assert not any(p.exists() for p in ours), [p for p in ours if p.exists()]
    assert "kept what it did not write (NOTES.md, mine/results.csv)" in run.stdout, run.stdout


def test_make_clean_of_another_demo_folder_removes_only_what_wan_trt_wrote_there(tmp_path):
    """`make clean DEMO_OUT=DIR` removed DIR/export, DIR/stream and DIR/bench.json whatever they held: a folder of the
    user's that happened to have those names went too. Only wan-trt's outputs (by their marker and files) and a bench
    report go now."""
    work = _checkout(tmp_path / "checkout")
    mine = tmp_path / "mine"
    theirs = [mine / "export" / "notes.txt", mine / "stream" / "holiday.mp4", mine / "bench.json"]
    _write(theirs)
    run = _make_clean(work, f"DEMO_OUT={mine}", f"VENV={tmp_path / 'venv'}")
    assert run.returncode == 0, run.stdout + run.stderr
    assert all(p.read_text() == "x" for p in theirs), [p for p in theirs if not p.exists()]
    demo = tmp_path / "demo"  # wan-trt's outputs in another DEMO_OUT: they go (clean reads DEMO_OUT, not out/demo)
    ours = _export(demo / "export") + _stream(demo / "stream") + [_bench_report(demo / "bench.json")]
    run = _make_clean(work, f"DEMO_OUT={demo}", f"VENV={tmp_path / 'venv'}")
    assert run.returncode == 0, run.stdout + run.stderr
    assert not any(p.exists() for p in ours), [p for p in ours if p.exists()]


def test_make_clean_removes_the_environment_beside_the_makefile_not_the_current_folders(tmp_path):
    """`make -f CHECKOUT/Makefile clean` run from another project removed that project's .venv: the environment was
    named relative to the current folder, not to the Makefile that makes it."""
    work = _checkout(tmp_path / "checkout")
    other = tmp_path / "project"
    _write([other / ".venv/bin/python", work / ".venv/bin/python"])
    run = _make_clean(other, makefile=work / "Makefile")
    assert run.returncode == 0, run.stdout + run.stderr
    assert (other / ".venv/bin/python").read_text() == "x" and not (work / ".venv").exists()


def test_make_clean_takes_the_rules_from_the_package(tmp_path):
    """The Makefile named the marker file by hand: a package whose marker were named otherwise would have had
    `make clean` remove folders by the old name and keep its own outputs. It asks the package (with no .venv:
    standard library only), so a source tree whose marker is renamed cleans by the new name."""
    work = _checkout(tmp_path)
    outputs = work / "wan_trt" / "outputs.py"
    text = outputs.read_text()
    assert f'MARKER = "{MARKER}"' in text
    outputs.write_text(text.replace(f'MARKER = "{MARKER}"', 'MARKER = ".renamed-marker"'))
    ours, theirs = work / "out/demo/export/.renamed-marker", work / f"out/demo/stream/{MARKER}"
    ours.parent.mkdir(parents=True)
    ours.write_text(marker_text("export"))
    theirs.parent.mkdir(parents=True)
    theirs.write_text(marker_text("stream output"))
    run = _make_clean(work)
    assert run.returncode == 0, run.stdout + run.stderr
    assert not ours.parent.exists() and theirs.read_text() == marker_text("stream output")


def test_make_clean_needs_no_python_with_nothing_to_judge_and_removes_nothing_without_one(tmp_path):
    """A fresh clone (no .venv, no demo output) cleans with no Python at all. Where a folder is to be judged and no
    Python tells wan-trt's files apart, nothing is removed (the environment neither) and the message says what to do."""
    work = _checkout(tmp_path)
    absent = f"BASE_PY={tmp_path / 'no-python3'}"
    run = _make_clean(work, absent)
    assert run.returncode == 0 and sorted(p.name for p in work.iterdir()) == ["Makefile", "wan_trt"], run.stderr
    kept = _export(work / "out/demo/export") + [_bench_report(work / "out/demo/bench.json")]
    _write([work / ".venv/bin/python"])
    run = _make_clean(work, absent)
    assert run.returncode != 0 and "nothing removed" in run.stderr and "BASE_PY=" in run.stderr, run.stderr
    assert all(p.exists() for p in kept) and (work / ".venv/bin/python").exists()


def test_make_clean_works_in_a_checkout_whose_path_has_a_space(tmp_path):
    """The Makefile found its own folder as an absolute path, which make splits at a space: in a checkout under
    "a b/", `make clean` ran `cd` into a folder that does not exist and said to install Python."""
    checkout = _checkout(tmp_path / "a b")
    ours, theirs = _export(checkout / "out/demo/export"), checkout / "out/mine/notes.txt"
    _write([theirs])
    run = _make_clean(checkout)  # as a user runs it
    assert run.returncode == 0, run.stdout + run.stderr
    assert not ours[0].parent.exists() and theirs.read_text() == "x"


def test_clean_never_removes_files_reached_through_a_linked_folder(tmp_path):
    """An export whose check/ is a symbolic link to a user's folder: clean removed the files there that looked like
    check reports (the report rules found them through the link), emptying a folder that was not the export's."""
    from wan_trt.owned import clean
    export = tmp_path / "export"
    ours = _export(export)
    theirs = tmp_path / "my_reports"
    theirs.mkdir()
    report = theirs / "report_other_project.json"
    report.write_text(json.dumps({"command": "x", "backend": "x", "precision": "fp32", "ok": True}))
    (export / "check").symlink_to(theirs)
    said = clean(export)
    assert report.is_file() and "kept what it did not write (check)" in said, said
    assert not any(p.exists() for p in ours) and (export / "check").is_symlink()
