"""``wan-trt bench``: every backend available here, side by side, streaming the same blocks.

Backends (each skipped with a reason when it cannot run here):
    upstream-eager    the upstream-semantics pipeline (rolling caches), PyTorch eager
    torch-eager       the static-cache session over the PyTorch model
    torch-compile     the same under torch.compile
    onnxruntime       the exported graph (CUDA EP on a GPU, CPU EP otherwise), io-binding
    torch-compile-plugins  torch.compile of the model with the fused wan_trt kernels
    aoti              the AOTInductor package (``--aoti-engine``)
    aoti+cudagraph    the same replayed as one CUDA graph per pass
    aoti-plugins(+cudagraph)  the AOTInductor package built with --ops plugins (``--aoti-plugins-engine``)
    tensorrt          the TensorRT engine (``--trt-engine``), when TensorRT imports

Per backend: ms per pass, ms per block (steady state: blocks after the first), P50/P95,
video frames per second (12 per steady block) and peak device memory.
"""
from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import torch

from wan_trt.engines.runner import Runner
from wan_trt.engines.session import StreamingSession, stream_blocks
from wan_trt.engines.torch_runner import TorchRunner
from wan_trt.errors import WanTrtError
from wan_trt.export.manifest import Manifest, reference_model
from wan_trt.log import logger, stage
from wan_trt.pipeline import ReferencePipeline
from wan_trt.profiling import (op_class_profile, peak_memory_gib, provenance, reset_peak_memory, summarize_ms,
                               synchronize)
from wan_trt.stream import NoiseSource, synthetic_stream

ALL_BACKENDS = ("upstream-eager", "torch-eager", "torch-compile", "torch-compile-plugins", "onnxruntime", "aoti",
                "aoti+cudagraph", "aoti-plugins", "aoti-plugins+cudagraph", "tensorrt")


def block_stats(block_seconds: list[float], pass_seconds: list[float], passes: int) -> dict[str, Any]:
    steady = [1e3 * s for s in block_seconds[1:]] or [1e3 * s for s in block_seconds]
    block = summarize_ms(steady)
    out = {"block_ms": block, "block_ms_all": [1e3 * s for s in block_seconds],
           "ms_per_pass": summarize_ms([1e3 * s for s in pass_seconds]) if pass_seconds else
           {"mean": block["mean"] / passes}, "video_fps": 12 / (block["mean"] / 1e3)}
    return out


def bench_session(runner: Runner, inputs, blocks: int) -> dict[str, Any]:
    """Stream ``blocks`` blocks through the static-cache session over ``runner``, synchronised per pass."""
    with runner:
        results = stream_blocks(StreamingSession(runner, noise=NoiseSource(0)), inputs, blocks)
    passes = [s for r in results[1:] for s in r.pass_seconds]
    return block_stats([r.seconds for r in results], passes, runner.spec.config.passes_per_block)


def bench_upstream(model, inputs, blocks: int) -> dict[str, Any]:
    """The upstream-semantics pipeline: time between yields = one block (and the previous clean pass)."""
    times, last = [], time.perf_counter()
    for _ in ReferencePipeline(model).run(inputs, blocks, NoiseSource(0)):
        synchronize()
        now = time.perf_counter()
        times.append(now - last)
        last = now
    return block_stats(times, [], model.cfg.passes_per_block)


class Bench:
    """Builds each backend lazily and records its numbers (or why it was skipped)."""

    def __init__(self, directory: Path, device: str, aoti_engine: Path | None, trt_engine: Path | None,
                 aoti_plugins_engine: Path | None = None):
        self.directory = directory
        self.manifest = Manifest.read(directory)
        self.spec = self.manifest.spec
        self.device = device
        self.engines = {"aoti": aoti_engine, "aoti-plugins": aoti_plugins_engine}
        self.trt_engine = trt_engine
        self._model = None
        self._plugin_model = None

    @property
    def model(self):
        if self._model is None:
            self._model = reference_model(self.manifest, self.spec.dtype, self.device)
        return self._model

    def runner(self, backend: str) -> Runner:
        """The runner of ``backend``; WanTrtError says why it cannot run here."""
        if backend == "torch-eager":
            return TorchRunner(self.model, self.spec)
        if backend == "torch-compile":
            return TorchRunner(self.model, self.spec, compile=True)
        if backend == "torch-compile-plugins":
            if self.device != "cuda":
                raise WanTrtError("the fused Triton kernels need a CUDA device")
            if self._plugin_model is None:
                self._plugin_model = reference_model(self.manifest, self.spec.dtype, self.device).use_plugins()
            runner = TorchRunner(self._plugin_model, self.spec, compile=True)
            runner.name = backend
            return runner
        if backend == "onnxruntime":
            from wan_trt.engines.onnxruntime_runner import OnnxRuntimeRunner
            provider = "cuda" if self.device == "cuda" else "cpu"
            if self.spec.precision != "fp32" and provider == "cpu":
                raise WanTrtError("ONNX Runtime's CPU provider has no bf16/fp16 kernels")
            return OnnxRuntimeRunner(self.manifest.graph_path(self.directory), self.spec, provider)
        if backend.startswith("aoti"):
            kind = backend.split("+")[0]
            if self.engines.get(kind) is None:
                flag = "--aoti-engine" if kind == "aoti" else "--aoti-plugins-engine"
                raise WanTrtError(f"no {flag} given (build one with `wan-trt build DIR --backend aoti`)")
            from wan_trt.engines.aoti import AotiRunner
            runner = AotiRunner(self.engines[kind], self.manifest, single_threaded="+" in backend)
            if "+" not in backend:
                return runner
            from wan_trt.engines.cuda_graph import CudaGraphRunner
            return CudaGraphRunner(runner)
        if backend == "tensorrt":
            from wan_trt.engines.tensorrt import import_tensorrt
            import_tensorrt()
            if self.trt_engine is None:
                raise WanTrtError("no --trt-engine given (build one with `wan-trt build DIR`)")
            from wan_trt.engines.tensorrt_runner import TensorRTRunner
            return TensorRTRunner(self.trt_engine, self.manifest)
        raise WanTrtError(f"unknown backend {backend!r}; expected one of {', '.join(ALL_BACKENDS)}")

    def run(self, backend: str, blocks: int) -> dict[str, Any]:
        inputs = synthetic_stream(self.spec.config, blocks, seed=0)
        reset_peak_memory()
        if backend == "upstream-eager":
            result = bench_upstream(self.model, inputs, blocks)
        else:
            result = bench_session(self.runner(backend), inputs, blocks)
        result["peak_torch_mem_gib"] = peak_memory_gib()
        return result

    def profile(self, backend: str) -> dict[str, Any]:
        """Op-class profile of one steady-state pass of ``backend``."""
        runner = self.runner(backend)
        feeds = self.spec.sample_inputs(device=self.device)
        with runner, torch.no_grad():
            for _ in range(3):
                runner.infer(feeds)
            return op_class_profile(lambda: runner.infer(feeds))


def run_bench(directory: str | Path, backends: list[str], blocks: int = 6, device: str = "cuda",
              aoti_engine: str | Path | None = None, trt_engine: str | Path | None = None,
              profile: list[str] | None = None, out: str | Path | None = None,
              chart: str | Path | None = None, aoti_plugins_engine: str | Path | None = None) -> dict[str, Any]:
    """Run every backend in ``backends`` (skipping, with the reason, those that cannot run)."""
    path = (lambda p: Path(p) if p else None)
    bench = Bench(Path(directory), device, path(aoti_engine), path(trt_engine), path(aoti_plugins_engine))
    cfg = bench.spec.config
    report: dict[str, Any] = {**provenance("wan-trt"),
                              "config": cfg.name, "precision": bench.spec.precision, "blocks": blocks,
                              "passes_per_block": cfg.passes_per_block, "weights": bench.manifest.weights,
                              "backends": {}, "skipped": {}, "profiles": {}}

    def save() -> None:
        if out:
            Path(out).parent.mkdir(parents=True, exist_ok=True)
            Path(out).write_text(json.dumps(report, indent=2))

    for backend in backends:
        try:
            with stage(f"bench {backend}"):
                report["backends"][backend] = bench.run(backend, blocks)
            logger.info("%s: %.1f ms/block", backend, report["backends"][backend]["block_ms"]["mean"])
        except WanTrtError as exc:
            report["skipped"][backend] = str(exc)
            logger.info("%s skipped: %s", backend, exc)
        except Exception as exc:  # a backend that breaks is reported (and fails the command); the others still run
            report.setdefault("failed", {})[backend] = f"{type(exc).__name__}: {exc}"[:2000]
            logger.exception("%s failed", backend)
        save()
    for backend in profile or []:
        if backend in report["backends"]:
            with stage(f"profile {backend}"):
                report["profiles"][backend] = bench.profile(backend)
            save()
    if chart and report["backends"]:
        write_chart(report, Path(chart))
    return report


def write_chart(report: dict[str, Any], path: Path) -> Path | None:
    """Bar chart of ms per block per backend (PNG); skipped when matplotlib is missing."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        logger.info("matplotlib is not installed: no chart")
        return None
    names = list(report["backends"])
    means = [report["backends"][n]["block_ms"]["mean"] for n in names]
    fig, ax = plt.subplots(figsize=(8, 0.5 + 0.45 * len(names)))
    ax.barh(names, means, color="#4c72b0")
    for y, value in enumerate(means):
        ax.text(value, y, f" {value:.1f}", va="center")
    ax.invert_yaxis()
    ax.set_xlabel("ms per steady-state block (lower is better)")
    ax.set_title(f"{report['config']} {report['precision']} on {report['environment'].get('device', '?')}")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
