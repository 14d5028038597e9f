"""The Makefile's clean target removes what the README's two commands made, nothing else."""
import shutil
import subprocess
from pathlib import Path

import pytest

from wan_trt.outputs import MARKER

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.skipif(shutil.which("make") is None, reason="make is not installed")


def _make_clean(cwd: Path, *args: str, makefile: Path = ROOT / "Makefile") -> subprocess.CompletedProcess:
    """`make clean` of ``makefile`` run in ``cwd`` (where its relative paths, .venv and out/demo, lie)."""
    return subprocess.run(["make", "-s", "-f", str(makefile), "clean", *args], cwd=cwd, capture_output=True, text=True)


def _write(paths: list[Path]) -> None:
    for path in paths:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text('{"backends": {}}' if path.name == "bench.json" else "x")  # as bench writes it


def test_make_clean_removes_the_demo_and_the_environment_not_a_users_outputs(tmp_path):
    """`make clean` ran `rm -rf .venv out`: every export, engine and result a user had put under out/ (where the
    README's examples put them) went with the demo's."""
    ours = [tmp_path / p for p in (".venv/bin/python", "out/demo/export/manifest.json", "out/demo/bench.json",
                                   "out/demo/stream/video.mp4", f"out/demo/export/{MARKER}", f"out/demo/stream/{MARKER}")]
    theirs = [tmp_path / p for p in ("out/uni/engine_aoti_plugins_cuda.pt2", "out/my_notes.txt")]
    _write(ours + theirs)
    run = _make_clean(tmp_path)
    assert run.returncode == 0, run.stdout + run.stderr
    assert not any(p.exists() for p in ours) and not (tmp_path / ".venv").exists()
    assert all(p.read_text() == "x" for p in theirs)


def test_make_clean_of_another_demo_folder_removes_only_what_wan_trt_wrote_there(tmp_path):
    """`make clean DEMO_OUT=DIR` removed DIR/export, DIR/stream and DIR/bench.json whatever they held: a folder of the
    user's that happened to have those names went too. Only folders holding wan-trt's marker (the demo's export and
    stream outputs) and a bench report go now."""
    mine = tmp_path / "mine"
    theirs = [mine / "export" / "notes.txt", mine / "stream" / "holiday.mp4", mine / "bench.json"]
    for path in theirs:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("x")
    run = _make_clean(tmp_path, f"DEMO_OUT={mine}", f"VENV={tmp_path / 'venv'}")
    assert run.returncode == 0, run.stdout + run.stderr
    assert all(p.read_text() == "x" for p in theirs), [p for p in theirs if not p.exists()]


def test_make_clean_takes_the_marker_name_from_the_package(tmp_path):
    """The Makefile named the marker file by hand: a package whose marker were named otherwise would have had
    `make clean` remove folders by the old name and keep its own outputs. It asks the package (with no .venv:
    standard library only), so a source tree whose marker is renamed cleans by the new name."""
    source = tmp_path / "source"
    shutil.copytree(ROOT / "wan_trt", source / "wan_trt", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(ROOT / "Makefile", source / "Makefile")
    outputs = source / "wan_trt" / "outputs.py"
    text = outputs.read_text()
    assert f'MARKER = "{MARKER}"' in text
    outputs.write_text(text.replace(f'MARKER = "{MARKER}"', 'MARKER = ".renamed-marker"'))
    work = tmp_path / "work"
    ours, theirs = work / "out/demo/export/.renamed-marker", work / f"out/demo/stream/{MARKER}"
    _write([ours, theirs])
    run = _make_clean(work, makefile=source / "Makefile")
    assert run.returncode == 0, run.stdout + run.stderr
    assert not ours.parent.exists() and theirs.read_text() == "x"


def test_make_clean_needs_no_python_with_nothing_to_judge_and_removes_nothing_without_one(tmp_path):
    """A fresh clone (no .venv, no demo output) cleans with no Python at all. Where a folder is to be judged and no
    Python tells the marker's name, nothing is removed (the environment neither) and the message says what to do."""
    absent = f"BASE_PY={tmp_path / 'no-python3'}"
    run = _make_clean(tmp_path, absent)
    assert run.returncode == 0 and not list(tmp_path.iterdir()), run.stdout + run.stderr
    kept = [tmp_path / p for p in (".venv/bin/python", f"out/demo/export/{MARKER}", "out/demo/bench.json")]
    _write(kept)
    run = _make_clean(tmp_path, absent)
    assert run.returncode != 0 and "nothing removed" in run.stderr and "BASE_PY=" in run.stderr, run.stderr
    assert all(p.exists() for p in kept)


def test_make_clean_works_in_a_checkout_whose_path_has_a_space(tmp_path):
    """The Makefile found its own folder as an absolute path, which make splits at a space: in a checkout under
    "a b/", `make clean` ran `cd` into a folder that does not exist and said to install Python."""
    checkout = tmp_path / "a b"
    shutil.copytree(ROOT / "wan_trt", checkout / "wan_trt", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(ROOT / "Makefile", checkout / "Makefile")
    ours, theirs = checkout / f"out/demo/export/{MARKER}", checkout / "out/mine/notes.txt"
    _write([ours, theirs])
    run = subprocess.run(["make", "-s", "clean"], cwd=checkout, capture_output=True, text=True)  # as a user runs it
    assert run.returncode == 0, run.stdout + run.stderr
    assert not ours.parent.exists() and theirs.read_text() == "x"
