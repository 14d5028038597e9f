"""The C++ runtime ships with the package: a non-editable install builds and runs wan_stream."""
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[3]
CPP_SOURCES = ("wan_trt/engines/cpp/CMakeLists.txt", "wan_trt/engines/cpp/src/runtime.cpp",
               "wan_trt/engines/cpp/include/wan_trt/runtime.h", "wan_trt/engines/cpp/tools/wan_stream.cpp")


@pytest.fixture(scope="module")
def wheel(tmp_path_factory):
    """A wheel of this checkout, built as `pip install .` would (no dependencies)."""
    out = tmp_path_factory.mktemp("wheel")
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "-w", str(out),
                    str(ROOT)], check=True, capture_output=True, cwd=out)
    (path,) = out.glob("wan_trt-*.whl")
    return path


def test_the_wheel_holds_the_cpp_sources_and_the_presets(wheel):
    names = set(zipfile.ZipFile(wheel).namelist())
    missing = [n for n in CPP_SOURCES + ("wan_trt/configs/universal.json",) if n not in names]
    assert not missing, missing


@pytest.mark.slow
def test_a_non_editable_install_builds_and_runs_wan_stream(wheel, aoti, tmp_path):
    """Fresh venv + the wheel; torch and the other dependencies come from this interpreter's site-packages."""
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    python = venv / "bin" / "python"
    subprocess.run([str(python), "-m", "pip", "install", "-q", "--no-deps", str(wheel)], check=True)
    site = subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                          check=True, capture_output=True, text=True).stdout.strip()
    Path(site, "deps.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")  # torch etc., not our checkout
    export_dir, engine = aoti
    script = f"""
import torch, wan_trt.config
from pathlib import Path
from wan_trt.engines.runtime.cpp import SOURCE, build_cpp, run_wan_stream, write_stream_inputs
from wan_trt.export.manifest import Manifest
from wan_trt.stream import synthetic_stream
assert str(SOURCE).startswith({site!r}), SOURCE  # the installed copy, not the checkout
inputs = synthetic_stream(Manifest.read({str(export_dir)!r}).spec.config, 2, seed=1)
exe = build_cpp(Path({str(tmp_path)!r}) / "build")
run = run_wan_stream(exe, Path({str(engine)!r}), write_stream_inputs(inputs, Path({str(tmp_path)!r}) / "in.pt"),
                     2, Path({str(tmp_path)!r}) / "out.pt")
torch.save(run.latents, {str(tmp_path / "latents.pt")!r})
print(wan_trt.config.__file__, len(run.block_ms))
"""
    res = subprocess.run([str(python), "-c", script], capture_output=True, text=True, cwd=tmp_path)
    assert res.returncode == 0, res.stderr[-3000:]
    assert res.stdout.split()[0].startswith(site) and res.stdout.split()[1] == "2", res.stdout
    latents = torch.load(tmp_path / "latents.pt")
    assert latents.shape[2] == 6 and torch.isfinite(latents).all()
