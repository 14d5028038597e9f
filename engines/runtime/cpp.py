"""Build and drive the C++ runtime (engines/cpp) from Python: CMake against the torch wheel's libtorch."""
from __future__ import annotations

import os
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

import torch

from wan_trt.errors import WanTrtError
from wan_trt.log import stage
from wan_trt.stream import StreamInputs

SOURCE = Path(__file__).resolve().parent.parent / "cpp"  # the C++ sources: engines/cpp


def build_cpp(build_dir: str | Path, tensorrt: bool = False, jobs: int | None = None,
              source: str | Path = SOURCE, tests: bool = False) -> Path:
    """Configure and build engines/cpp (or ``source``: the same folder of another version) into
    ``build_dir``; returns the ``wan_stream`` executable. ``tests``: the C++ test drivers too (beside it;
    from a checkout, whose engines/cpp/tests an installed package does not hold). ``tensorrt``: the TensorRT runner
    too; where TensorRT is not found the build stops. Raises WanTrtError without cmake on PATH, or with the reason
    a step failed."""
    import torch.utils

    cmake = shutil.which("cmake")
    if cmake is None:
        raise WanTrtError("building the C++ runtime needs cmake (3.18 or later), which is not on PATH; install it "
                          "(`pip install cmake`, or the system's package) or put it on PATH")
    build_dir = Path(build_dir)
    configure = [cmake, "-S", str(source), "-B", str(build_dir), f"-DCMAKE_PREFIX_PATH={torch.utils.cmake_prefix_path}",
                 f"-DWAN_TRT_WITH_TENSORRT={'ON' if tensorrt else 'OFF'}", f"-DWAN_TRT_BUILD_TESTS={'ON' if tests else 'OFF'}"]
    build = [cmake, "--build", str(build_dir), "-j", str(jobs or os.cpu_count() or 2)]
    with stage(f"cmake configure + build ({source})"):
        for step, cmd in (("cmake configure", configure), ("cmake --build", build)):
            proc = subprocess.run(cmd, capture_output=True, text=True)
            if proc.returncode != 0:
                raise _failure(step, proc)
    return build_dir / "wan_stream"


def _failure(step: str, proc: subprocess.CompletedProcess) -> WanTrtError:
    """A failed cmake step as one error: CMake's own message where it stopped with one (a missing TensorRT says what
    is missing and what to install), else the ends of its output (a compiler's errors)."""
    _, error, rest = proc.stderr.partition("CMake Error")
    if error:  # "CMake Error at FILE:LINE (message):" over the message, indented, to a blank line; or "CMake Error: ..."
        head, _, body = rest.partition("\n")
        message = body.split("\n\n")[0] if head.rstrip().endswith(":") else head.lstrip(": ")
        return WanTrtError(f"{step} failed: {' '.join(message.split())}")
    return WanTrtError(f"{step} failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")


def write_stream_inputs(inputs: StreamInputs, path: str | Path) -> Path:
    """The stream inputs in the torch.save format ``wan_stream --inputs`` reads (pass their
    ``first_block`` as ``start_block`` to :func:`run_wan_stream`)."""
    torch.save({"visual_context": inputs.visual_context, "cond_concat": inputs.cond_concat,
                "mouse": inputs.mouse, "keyboard": inputs.keyboard, "first_block": inputs.first_block}, str(path))
    return Path(path)


@dataclass
class CppStream:
    """What ``wan_stream`` wrote and printed: the latents [1, 16, 3N, h, w], the frames (with a decoder:
    uint8 [9 + 12 (N - 1), 8h, 8w, 3]), and per block its milliseconds and its stages' milliseconds."""

    latents: torch.Tensor
    frames: torch.Tensor | None
    block_ms: list[float]
    stage_ms: list[dict[str, float]]


def run_wan_stream(exe: Path, engine: Path, inputs: Path, blocks: int, out: Path, seed: int = 0,
                   device: str = "cpu", cuda_graph: bool = False, start_block: int | None = None,
                   decoder: Path | None = None, actions: Path | None = None, overwrite: bool = False) -> CppStream:
    """Run ``wan_stream`` (from the inputs' first block; ``start_block``, if given, must be it); with
    ``decoder`` (either engine of a decoder engine pair) its frames go to ``out`` + '.frames.pt';
    ``actions``: a JSON-lines actions file replacing the inputs' actions; ``overwrite``: replace an earlier
    run's outputs."""
    cmd = [str(exe), "--engine", str(engine), "--inputs", str(inputs), "--blocks", str(blocks), "--out", str(out),
           "--seed", str(seed), "--device", device]
    cmd += [] if start_block is None else ["--start-block", str(start_block)]
    cmd += ["--cuda-graph"] if cuda_graph else []
    frames = Path(str(out) + ".frames.pt")
    cmd += [] if decoder is None else ["--decoder", str(decoder), "--frames", str(frames)]
    cmd += [] if actions is None else ["--actions", str(actions)]
    cmd += ["--overwrite"] if overwrite else []
    proc = subprocess.run(cmd, capture_output=True, text=True, errors="replace")  # paths may hold any bytes
    if proc.returncode != 0:
        raise WanTrtError(f"wan_stream failed ({proc.returncode}): {proc.stderr[-3000:]}")
    block_ms, stage_ms = [], []
    for line in proc.stdout.splitlines():  # block <i>: <ms> ms (<stage> <ms>, ...)
        if line.startswith("block "):
            head, _, stages = line.partition(" ms (")
            block_ms.append(float(head.split(":")[1]))
            stage_ms.append({k: float(v) for k, v in (part.split() for part in stages.rstrip(")").split(", "))})
    return CppStream(torch.load(str(out)), torch.load(str(frames)) if decoder is not None else None, block_ms, stage_ms)
