"""The Makefile's clean target removes what the README's two commands made, nothing else."""
import shutil
import subprocess
from pathlib import Path

import pytest

from wan_trt.outputs import MARKER

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.skipif(shutil.which("make") is None, reason="make is not installed")
def test_make_clean_removes_the_demo_and_the_environment_not_a_users_outputs(tmp_path):
    """`make clean` ran `rm -rf .venv out`: every export, engine and result a user had put under out/ (where the
    README's examples put them) went with the demo's."""
    shutil.copy(ROOT / "Makefile", tmp_path / "Makefile")
    ours = [tmp_path / p for p in (".venv/bin/python", "out/demo/export/manifest.json", "out/demo/bench.json",
                                   "out/demo/stream/video.mp4", f"out/demo/export/{MARKER}", f"out/demo/stream/{MARKER}")]
    theirs = [tmp_path / p for p in ("out/uni/engine_aoti_plugins_cuda.pt2", "out/my_notes.txt")]
    for path in ours + theirs:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text('{"backends": {}}' if path.name == "bench.json" else "x")  # as bench writes it
    run = subprocess.run(["make", "-s", "clean"], cwd=tmp_path, capture_output=True, text=True)
    assert run.returncode == 0, run.stdout + run.stderr
    assert not any(p.exists() for p in ours) and not (tmp_path / ".venv").exists()
    assert all(p.read_text() == "x" for p in theirs)


@pytest.mark.skipif(shutil.which("make") is None, reason="make is not installed")
def test_make_clean_of_another_demo_folder_removes_only_what_wan_trt_wrote_there(tmp_path):
    """`make clean DEMO_OUT=DIR` removed DIR/export, DIR/stream and DIR/bench.json whatever they held: a folder of the
    user's that happened to have those names went too. Only folders holding wan-trt's marker (the demo's export and
    stream outputs) and a bench report go now."""
    shutil.copy(ROOT / "Makefile", tmp_path / "Makefile")
    mine = tmp_path / "mine"
    theirs = [mine / "export" / "notes.txt", mine / "stream" / "holiday.mp4", mine / "bench.json"]
    for path in theirs:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("x")
    run = subprocess.run(["make", "-s", "clean", f"DEMO_OUT={mine}", f"VENV={tmp_path / 'venv'}"], cwd=tmp_path,
                         capture_output=True, text=True)
    assert run.returncode == 0, run.stdout + run.stderr
    assert all(p.read_text() == "x" for p in theirs), [p for p in theirs if not p.exists()]
