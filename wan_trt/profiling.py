"""Timing and op-class profiles for benchmarks (device-side time, CUDA events / torch.profiler)."""
from __future__ import annotations

import json
import os
import platform
import re
import shlex
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any, Callable

import torch

from wan_trt.errors import WanTrtError
from wan_trt.plugins.registry import FUSED_OPS

# Kernel-name patterns -> op class, first match wins (lower-case names).
OP_CLASSES = [
    ("attention", r"flash|fmha|attention|sdpa|cudnn.*(mha|attn)|efficient_attention"),
    # cuDNN's convolutions (dgrad: its transposed convolutions)
    ("conv", r"fprop_implicit_gemm|dgrad_implicit_gemm|implicit_convolve|winograd|conv_fprop"),
    ("gemm", r"gemm|sm90_xmma|cutlass|matmul|nvjet|ampere_bf16|wgmma|splitk"),
    ("norm", r"layer_norm|layernorm|rms|norm_|adaln"),
    ("copy/cat", r"copy|cat|concat|transpose|permute|gather|index|elementwise_kernel_with_index"),
    ("elementwise", r"elementwise|vectorized|unrolled|reduce|triton|fused|mul|add|gelu|silu|exp"),
]


# The fused ops' Triton kernels (``_<name>_kernel``).
WAN_TRT_KERNEL = re.compile("|".join(op.kernel_name for op in FUSED_OPS))


def device_name(device: torch.device | str = "cuda") -> str:
    device = torch.device(device)
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    return f"cpu ({platform.processor() or platform.machine()})"


# environment variables that change which kernels the CUDA libraries run (recorded where set)
KERNEL_ENV = ("CUBLASLT_WORKSPACE_SIZE", "CUBLAS_WORKSPACE_CONFIG")


def environment(device: torch.device | str | None = None) -> dict[str, Any]:
    """Tool versions and device of a result file: ``device`` (what the work ran on), by default the
    current CUDA device where there is one, else the CPU; ``variables``: those of :data:`KERNEL_ENV` set."""
    env = {"torch": torch.__version__, "python": platform.python_version()}
    variables = {name: os.environ[name] for name in KERNEL_ENV if name in os.environ}
    if variables:
        env["variables"] = variables
    device = torch.device(device if device is not None else "cuda" if torch.cuda.is_available() else "cpu")
    if device.type == "cuda":
        env.update(device=torch.cuda.get_device_name(device), cuda=torch.version.cuda,
                   driver_capability=list(torch.cuda.get_device_capability(device)))
    else:
        env["device"] = device_name(device)
    try:
        import triton
        env["triton"] = triton.__version__
    except ImportError:
        pass
    return env


def write_result(path: str | Path, result: dict[str, Any], indent: int = 1) -> None:
    """A measuring script's result file, written whole or not at all (a staging file renamed over the earlier
    one: a run that fails half-way leaves that as it was), as strict JSON (non-finite numbers as null)."""
    from wan_trt.outputs import json_values, write_file
    write_file(Path(path), (json.dumps(json_values(result), indent=indent, allow_nan=False) + "\n").encode())


def command_line(program: str | None = None) -> str:
    """This process's command: ``program`` (default this script's name) and its arguments, quoted for a shell
    where they need it (a path with a space runs again as one argument)."""
    return shlex.join([program or Path(sys.argv[0]).name, *sys.argv[1:]])


def provenance(program: str | None = None, device: torch.device | str | None = None) -> dict[str, Any]:
    """The ``command`` (:func:`command_line`), ``environment`` (of ``device``, see :func:`environment`) and
    ``source`` (:func:`source_revision`) fields every result file starts with."""
    return {"command": command_line(program), "environment": environment(device), "source": source_revision()}


SOURCE_ROOT = Path(__file__).resolve().parents[1]  # the checkout wan-trt runs from (editable install)


def source_revision(root: Path = SOURCE_ROOT) -> dict[str, Any] | None:
    """The code that made a result: the checkout's git ``commit``, whether tracked files differed from it
    (``dirty``) and the git ``tree`` id of the tracked files as they were. The tree names the code exactly
    even where the commit does not (local changes, or a copy of a work tree beside older git metadata):
    the commit that holds that code has that tree (``git log --format='%H %T'``). None outside a git
    checkout and before its first commit."""
    def git(*args: str, index: str | None = None) -> str:
        env = None if index is None else {**os.environ, "GIT_INDEX_FILE": index}
        return subprocess.run(["git", "-C", str(root), *args], check=True, capture_output=True, text=True,
                              timeout=30, env=env).stdout.strip()
    try:
        if Path(git("rev-parse", "--show-toplevel")).resolve() != root.resolve():
            return None  # an installed copy inside some other repository
        dirty = git("status", "--porcelain", "--untracked-files=no") != ""
        if not dirty:
            tree = git("rev-parse", "HEAD^{tree}")
        else:  # stage the tracked files in a copy of the index (the checkout's own stays as it is): files
            with tempfile.TemporaryDirectory() as scratch:  # added but not committed count, as they are
                index = str(Path(scratch) / "index")
                own = Path(root, git("rev-parse", "--git-path", "index"))
                if own.is_file():
                    shutil.copyfile(own, index)
                else:
                    git("read-tree", "HEAD", index=index)
                git("add", "--update", index=index)
                tree = git("write-tree", index=index)
        return {"commit": git("rev-parse", "HEAD"), "dirty": dirty, "tree": tree}
    except (OSError, subprocess.SubprocessError):
        return None


def summarize_ms(samples: list[float]) -> dict[str, float]:
    """mean, p50 (the median: the middle two samples' mean for an even count), p95, min and the count n."""
    if not samples:
        raise WanTrtError("no samples to summarize")
    ordered = sorted(samples)
    return {"mean": statistics.fmean(ordered), "p50": statistics.median(ordered),
            "p95": ordered[min(len(ordered) - 1, int(round(0.95 * (len(ordered) - 1))))],
            "min": ordered[0], "n": len(ordered)}


def op_class_profile(fn: Callable[[], Any], device: torch.device | str, top: int = 25) -> dict[str, Any]:
    """Device time of one call of ``fn`` on ``device`` by op class and the top kernels (torch.profiler)."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CUDA, ProfilerActivity.CPU]) as prof:
        fn()
        synchronize(device)
    kernels: dict[str, float] = {}
    launches: dict[str, int] = {}
    for evt in prof.events():
        if evt.device_type == torch.autograd.DeviceType.CUDA:
            kernels[evt.name] = kernels.get(evt.name, 0.0) + evt.device_time_total / 1e3
            launches[evt.name] = launches.get(evt.name, 0) + 1
    classes: dict[str, float] = {}
    for name, ms in kernels.items():
        classes[classify(name)] = classes.get(classify(name), 0.0) + ms
    total = sum(kernels.values())
    ranked = sorted(kernels.items(), key=lambda kv: -kv[1])[:top]
    return {"total_ms": total, "by_class_ms": dict(sorted(classes.items(), key=lambda kv: -kv[1])),
            "top_kernels_ms": [{"kernel": k[:160], "class": classify(k), "ms": v, "launches": launches[k]}
                               for k, v in ranked],
            "wan_trt_kernel_launches": {k[:80]: n for k, n in launches.items() if WAN_TRT_KERNEL.search(k)}}


def classify(kernel: str) -> str:
    lower = kernel.lower()
    for name, pattern in OP_CLASSES:
        if re.search(pattern, lower):
            return name
    return "other"


def _cuda(device: torch.device | str) -> torch.device | None:
    """``device`` if it is a CUDA device, else None: the memory and sync helpers act on the device a run
    uses (``cuda:1`` included), never on whichever is current, and on nothing for a CPU run."""
    device = torch.device(device)
    return device if device.type == "cuda" else None


def reset_peak_memory(device: torch.device | str) -> None:
    if (cuda := _cuda(device)) is not None:
        torch.cuda.reset_peak_memory_stats(cuda)


def allocated_memory_gib(device: torch.device | str) -> float | None:
    """Memory allocated on ``device`` now (None for a CPU run)."""
    return torch.cuda.memory_allocated(cuda) / 2 ** 30 if (cuda := _cuda(device)) is not None else None


def peak_memory_gib(device: torch.device | str) -> float | None:
    """Peak memory allocated on ``device`` since the last reset (None for a CPU run)."""
    return torch.cuda.max_memory_allocated(cuda) / 2 ** 30 if (cuda := _cuda(device)) is not None else None


def synchronize(device: torch.device | str) -> None:
    """Wait for ``device``'s work (nothing to wait for on the CPU)."""
    if (cuda := _cuda(device)) is not None:
        torch.cuda.synchronize(cuda)
