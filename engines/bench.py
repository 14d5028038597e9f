"""``wan-trt bench``: every backend available here, side by side, streaming the same blocks.

Backends: see :mod:`wan_trt.engines.backends`.

Without ``backends`` every backend runs, and those this machine cannot run (no CUDA device,
no TensorRT, no engine file given, ...) are skipped with the reason. Backends named explicitly
must run: an unknown name is refused before any work, and a named backend that cannot run is a
failure (the command exits non-zero; the others' results are still written). A backend that
raises is a failure with its traceback in the report.

Per backend: ms per pass, ms per block (steady state: blocks after the first), P50/P95,
video frames per second (12 per steady block) and peak device memory.
"""
from __future__ import annotations

import json
import time
import traceback
from pathlib import Path
from typing import Any

import torch

from wan_trt.engines.backends import ALL_BACKENDS
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


class Unavailable(WanTrtError):
    """This machine or these flags cannot run a backend: skipped in the default set, a failure when named."""


def parse_backends(names: str | None) -> list[str] | None:
    """``--backends`` as a list (None: the default set); unknown names are refused before any work."""
    if names is None:
        return None
    backends = [b.strip() for b in names.split(",") if b.strip()]
    unknown = [b for b in backends if b not in ALL_BACKENDS]
    if unknown or not backends:
        raise WanTrtError(f"--backends: unknown backend(s) {', '.join(map(repr, unknown)) or '(none given)'}; "
                          f"valid: {', '.join(ALL_BACKENDS)}")
    return backends


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
        """The runner of ``backend``; :class:`Unavailable` says why this machine cannot run it."""
        if backend == "torch-eager":
            return TorchRunner(self.model, self.spec)
        if backend == "torch-compile":
            return TorchRunner(self.model, self.spec, compile=True)
        if backend == "torch-compile-plugins":
            return self._plugin_runner(backend)
        if backend == "onnxruntime":
            return self._onnxruntime_runner()
        if backend.startswith("aoti"):
            return self._aoti_runner(backend)
        if backend == "tensorrt":
            return self._tensorrt_runner()
        raise WanTrtError(f"unknown backend {backend!r}; expected one of {', '.join(ALL_BACKENDS)}")

    def _plugin_runner(self, backend: str) -> Runner:
        if self.device != "cuda":
            raise Unavailable("the fused Triton kernels need a CUDA device (--device cuda)")
        if self._plugin_model is None:
            self._plugin_model = reference_model(self.manifest, self.spec.dtype, self.device).use_plugins()
        runner = TorchRunner(self._plugin_model, self.spec, compile=True)
        runner.name = backend
        return runner

    def _onnxruntime_runner(self) -> Runner:
        from wan_trt.engines.onnxruntime_runner import OnnxRuntimeRunner, available_providers
        provider = "cuda" if self.device == "cuda" else "cpu"
        if self.spec.precision != "fp32" and provider == "cpu":
            raise Unavailable(f"ONNX Runtime's CPU provider has no {self.spec.precision} kernels (a --device cuda "
                              "bench runs the CUDA provider; or export --precision fp32)")
        if self.manifest.graph is None:
            raise Unavailable(f"{self.directory} was exported with --no-onnx: it has no ONNX graph")
        if provider == "cuda" and "CUDAExecutionProvider" not in available_providers():
            raise Unavailable("this ONNX Runtime has no CUDA provider: pip install onnxruntime-gpu")
        return OnnxRuntimeRunner(self.manifest.graph_path(self.directory), self.spec, provider)

    def _aoti_runner(self, backend: str) -> Runner:
        kind = backend.split("+")[0]
        if self.engines.get(kind) is None:
            flag = "--aoti-engine" if kind == "aoti" else "--aoti-plugins-engine"
            raise Unavailable(f"no {flag} given (build one with `wan-trt build DIR --backend aoti`)")
        if "+" in backend and self.device != "cuda":
            raise Unavailable("CUDA graphs need a CUDA device (--device cuda)")
        from wan_trt.engines.aoti import AotiRunner
        runner = AotiRunner(self.engines[kind], self.manifest, single_threaded="+" in backend)
        if "+" not in backend:
            return runner
        from wan_trt.engines.cuda_graph import CudaGraphRunner
        return CudaGraphRunner(runner)

    def _tensorrt_runner(self) -> Runner:
        from wan_trt.engines.tensorrt import import_tensorrt
        try:
            import_tensorrt()
        except WanTrtError as exc:
            raise Unavailable(str(exc)) from None
        if self.trt_engine is None:
            raise Unavailable("no --trt-engine given (build one with `wan-trt build DIR`)")
        from wan_trt.engines.tensorrt_runner import TensorRTRunner
        return TensorRTRunner(self.trt_engine, self.manifest)

    def run(self, backend: str, blocks: int) -> dict[str, Any]:
        inputs = synthetic_stream(self.spec.config, blocks, seed=0)
        reset_peak_memory()
        if backend == "reference-eager":
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


def run_bench(directory: str | Path, backends: list[str] | None = None, blocks: int = 6, device: str = "cuda",
              aoti_engine: str | Path | None = None, trt_engine: str | Path | None = None,
              profile: list[str] | None = None, out: str | Path | None = None,
              chart: str | Path | None = None, aoti_plugins_engine: str | Path | None = None) -> dict[str, Any]:
    """Run ``backends`` (None: every backend, skipping with the reason those this machine cannot run).

    Named backends must run: one that cannot, or that raises, lands in ``report["failed"]``.
    """
    named = backends is not None
    backends = list(ALL_BACKENDS) if backends is None else parse_backends(",".join(backends))
    not_benched = [p for p in profile or [] if p not in backends]
    if not_benched:
        raise WanTrtError(f"--profile {','.join(not_benched)}: not among the benched backends ({', '.join(backends)})")
    path = (lambda p: Path(p) if p else None)
    bench = Bench(Path(directory), device, path(aoti_engine), path(trt_engine), path(aoti_plugins_engine))
    cfg = bench.spec.config
    report: dict[str, Any] = {**provenance("wan-trt"),
                              "config": cfg.name, "precision": bench.spec.precision, "blocks": blocks,
                              "passes_per_block": cfg.passes_per_block, "weights": bench.manifest.weights,
                              "backends": {}, "skipped": {}, "failed": {}, "profiles": {}}

    def save() -> None:
        if out:
            Path(out).parent.mkdir(parents=True, exist_ok=True)
            Path(out).write_text(json.dumps(report, indent=2))

    save()  # an unwritable --out fails now, not after minutes of benchmarking
    for backend in backends:
        _bench_one(bench, backend, blocks, report, named)
        save()
    for backend in profile or []:
        if backend in report["backends"]:
            with stage(f"profile {backend}"):
                report["profiles"][backend] = bench.profile(backend)
            save()
    if chart and report["backends"]:
        write_chart(report, Path(chart))
    return report


def _bench_one(bench: Bench, backend: str, blocks: int, report: dict[str, Any], named: bool) -> None:
    """Bench one backend into ``report``: its numbers, why it was skipped, or why it failed."""
    try:
        with stage(f"bench {backend}"):
            report["backends"][backend] = bench.run(backend, blocks)
        logger.info("%s: %.1f ms/block", backend, report["backends"][backend]["block_ms"]["mean"])
    except Unavailable as exc:
        if named:
            report["failed"][backend] = f"asked for, but cannot run on this machine: {exc}"
            logger.error("%s cannot run: %s", backend, exc)
        else:
            report["skipped"][backend] = str(exc)
            logger.info("%s skipped: %s", backend, exc)
    except WanTrtError as exc:  # e.g. an engine built for another export
        report["failed"][backend] = str(exc)
        logger.error("%s failed: %s", backend, exc)
    except Exception as exc:  # a backend that breaks is a failure with its traceback; the others still run
        report["failed"][backend] = f"{type(exc).__name__}: {exc}\n{traceback.format_exc()}"[-8000:]
        logger.exception("%s failed", backend)


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
