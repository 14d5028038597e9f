"""Build and drive the C++ runtime (engines/cpp) from Python: CMake against the torch wheel's libtorch."""
from __future__ import annotations

import os
import subprocess
from pathlib import Path

import torch

from wan_trt.errors import WanTrtError
from wan_trt.log import stage
from wan_trt.stream import StreamInputs

SOURCE = Path(__file__).resolve().parent.parent / "cpp"  # the C++ sources: engines/cpp


def build_cpp(build_dir: str | Path, tensorrt: bool = False, jobs: int | None = None) -> Path:
    """Configure and build engines/cpp into ``build_dir``; returns the ``wan_stream`` executable."""
    import torch.utils

    build_dir = Path(build_dir)
    configure = ["cmake", "-S", str(SOURCE), "-B", str(build_dir), f"-DCMAKE_PREFIX_PATH={torch.utils.cmake_prefix_path}",
                 f"-DWAN_TRT_WITH_TENSORRT={'ON' if tensorrt else 'OFF'}"]
    with stage("cmake configure + build (engines/cpp)"):
        for cmd in (configure, ["cmake", "--build", str(build_dir), "-j", str(jobs or os.cpu_count() or 2)]):
            proc = subprocess.run(cmd, capture_output=True, text=True)
            if proc.returncode != 0:
                raise WanTrtError(f"{' '.join(cmd[:2])} failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
    return build_dir / "wan_stream"


def write_stream_inputs(inputs: StreamInputs, path: str | Path) -> Path:
    """The stream inputs in the torch.save format ``wan_stream --inputs`` reads (pass their
    ``first_block`` as ``start_block`` to :func:`run_wan_stream`)."""
    torch.save({"visual_context": inputs.visual_context, "cond_concat": inputs.cond_concat,
                "mouse": inputs.mouse, "keyboard": inputs.keyboard, "first_block": inputs.first_block}, str(path))
    return Path(path)


def run_wan_stream(exe: Path, engine: Path, inputs: Path, blocks: int, out: Path, seed: int = 0,
                   device: str = "cpu", cuda_graph: bool = False, start_block: int | None = None
                   ) -> tuple[torch.Tensor, list[float]]:
    """Run ``wan_stream`` (from the inputs' first block; ``start_block``, if given, must be it);
    returns the latents and the per-block milliseconds it printed."""
    cmd = [str(exe), "--engine", str(engine), "--inputs", str(inputs), "--blocks", str(blocks), "--out", str(out),
           "--seed", str(seed), "--device", device]
    cmd += [] if start_block is None else ["--start-block", str(start_block)]
    cmd += ["--cuda-graph"] if cuda_graph else []
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        raise WanTrtError(f"wan_stream failed ({proc.returncode}): {proc.stderr[-3000:]}")
    ms = [float(line.split(":")[1].split()[0]) for line in proc.stdout.splitlines() if line.startswith("block ")]
    return torch.load(str(out)), ms
