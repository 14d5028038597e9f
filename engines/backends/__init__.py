"""The backend registry: every backend wan-trt can build, check, stream or bench, registered once
(:data:`BACKENDS`; ``wan-trt bench --help`` lists the names).

Each entry names the module that holds its build and its runner (``engines/backends/<module>.py``,
each exposing ``make_runner(backend, sources)`` and, for engines, ``build(directory, options)``,
``check_options(options)`` (what this machine cannot build, refused before an export is made) and
``inspect(engine, meta)``), what it needs, and the test that exercises it. The CLI's choices and
help, ``build``, ``check``, ``stream`` and ``bench`` all read this table.

This module imports nothing heavy (the CLI reads it for its help); a backend's module is imported
when the backend is first used (:func:`backend_module`).
"""
from __future__ import annotations

import importlib
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Any, Callable

from wan_trt.errors import WanTrtError

if TYPE_CHECKING:  # annotations only: this module stays free of torch for the CLI's start-up
    from wan_trt.export.manifest import Manifest
    from wan_trt.spec import PassSpec


class Unavailable(WanTrtError):
    """This machine or these flags cannot run a backend: skipped in the default set, a failure when named."""


@dataclass(frozen=True)
class Backend:
    """One registered backend.

    Attributes:
        name: the name on the command line (``--backends``, ``--backend``, reports).
        module: the module under ``wan_trt.engines.backends`` holding its build and runner.
        summary: one line for ``wan-trt bench --help``.
        requires: what it needs beyond the export, checked in this order before its runner is made:
            ``tensorrt`` (TensorRT installed), ``engine`` (an engine file, given with ``engine_flag``),
            ``cuda`` (a CUDA device). Checks that depend on the export live in its module.
        engine_flag: the bench flag that gives its engine file.
        engine_key: which engine file (several backends run the same file).
        ops: the graph/model flavour it runs (``native`` or ``plugins``).
        cuda_graph: replayed as CUDA graphs.
        compile: run under torch.compile (the PyTorch backends).
        reference_pipeline: the upstream-semantics reference pipeline, run as a whole (no runner).
        builds: ``wan-trt build --backend NAME`` builds its engine.
        engine_suffix: how the name of the engine file it builds ends by default (``wan-trt build`` without
            ``--out``). any_engine_name: ``--out`` may be named otherwise (TensorRT reads a plan of any name; an
            AOTInductor package must be a .pt2), but never as another backend's engine must be; checked before
            any export or trace (:func:`check_engine_name`).
        test: the test module that runs it (checked by tests/engines/backends/test_registry.py).
    """

    name: str
    module: str
    summary: str
    test: str
    requires: tuple[str, ...] = ()
    engine_flag: str | None = None
    engine_key: str | None = None
    ops: str = "native"
    cuda_graph: bool = False
    builds: bool = False
    engine_suffix: str | None = None
    any_engine_name: bool = False
    compile: bool = False
    reference_pipeline: bool = False


BACKENDS: tuple[Backend, ...] = (
    Backend("reference-eager", "torch", "wan-trt's reference pipeline with upstream's rolling-cache semantics, eager",
            "tests/engines/backends/test_registry.py", reference_pipeline=True),
    Backend("torch-eager", "torch", "the static-cache session over the PyTorch model",
            "tests/engines/backends/test_registry.py"),
    Backend("torch-compile", "torch", "the static-cache session under torch.compile", "tests/engines/backends/test_registry.py",
            compile=True),
    Backend("torch-compile-plugins", "torch", "torch.compile of the model with the fused wan_trt kernels (CUDA)",
            "tests/engines/backends/test_registry.py", requires=("cuda",), ops="plugins", compile=True),
    Backend("onnxruntime", "onnxruntime", "the exported graph (CUDA provider on a GPU, CPU provider otherwise)",
            "tests/export/test_transformer.py"),
    Backend("aoti", "aoti", "the AOTInductor package (--aoti-engine)", "tests/engines/backends/test_aoti.py",
            requires=("engine",), engine_flag="--aoti-engine", engine_key="aoti", builds=True,
            engine_suffix=".pt2"),
    Backend("aoti+cudagraph", "aoti", "the AOTInductor package replayed as CUDA graphs",
            "tests/engines/backends/test_aoti.py", requires=("engine", "cuda"), engine_flag="--aoti-engine",
            engine_key="aoti", cuda_graph=True),
    Backend("aoti-plugins", "aoti", "the package built with --ops plugins (--aoti-plugins-engine)",
            "tests/engines/backends/test_aoti.py", requires=("engine",), engine_flag="--aoti-plugins-engine",
            engine_key="aoti-plugins", ops="plugins"),
    Backend("aoti-plugins+cudagraph", "aoti", "the --ops plugins package replayed as CUDA graphs",
            "tests/engines/backends/test_aoti.py", requires=("engine", "cuda"),
            engine_flag="--aoti-plugins-engine", engine_key="aoti-plugins", ops="plugins", cuda_graph=True),
    Backend("tensorrt", "tensorrt", "the TensorRT engine (--trt-engine)", "tests/engines/backends/test_tensorrt.py",
            requires=("tensorrt", "engine"), engine_flag="--trt-engine", engine_key="tensorrt", builds=True,
            engine_suffix=".plan", any_engine_name=True),
)
BY_NAME = {b.name: b for b in BACKENDS}
ALL_BACKENDS = tuple(BY_NAME)
BUILDABLE = tuple(b.name for b in BACKENDS if b.builds)
DEFAULT_BUILD = "tensorrt"
ENGINE_FLAGS = {b.engine_key: b.engine_flag for b in BACKENDS if b.engine_key}


def get_backend(name: str, flag: str = "--backend") -> Backend:
    """The entry registered as ``name``; an unknown name is refused with the valid ones."""
    if name not in BY_NAME:
        raise WanTrtError(f"{flag}: unknown backend {name!r}; valid: {', '.join(ALL_BACKENDS)}")
    return BY_NAME[name]


def check_engine_name(backend: Backend, engine: Path) -> None:
    """Refuse an engine path not named as ``backend``'s engine files are (AOTInductor fails on another name only
    after the export and the trace), before any of that work."""
    suffix = backend.engine_suffix
    if suffix is None or engine.suffix == suffix:
        return
    if not backend.any_engine_name:
        raise WanTrtError(f"--out {engine}: --backend {backend.name} writes a {suffix} file; name it e.g. "
                          f"{engine.with_name(engine.stem + suffix)}")
    owners = [b.name for b in BACKENDS if b.builds and not b.any_engine_name and b.engine_suffix == engine.suffix]
    if owners:
        raise WanTrtError(f"--out {engine}: a {engine.suffix} file is an engine of --backend {owners[0]}; name the "
                          f"{backend.name} engine otherwise, e.g. {engine.with_name(engine.stem + suffix)}")


def parse_backends(names: str | None, flag: str = "--backends") -> list[str] | None:
    """``--backends`` (or another ``flag`` naming backends) as a list (None: the default set); unknown names, and a
    name given twice (its second run would replace the first's row), are refused before any work."""
    if names is None:
        return None
    backends = [b.strip() for b in names.split(",") if b.strip()]
    unknown = [b for b in backends if b not in BY_NAME]
    if unknown or not backends:
        raise WanTrtError(f"{flag}: unknown backend(s) {', '.join(map(repr, unknown)) or '(none given)'}; "
                          f"valid: {', '.join(ALL_BACKENDS)}")
    twice = sorted({b for b in backends if backends.count(b) > 1})
    if twice:
        raise WanTrtError(f"{flag}: {', '.join(map(repr, twice))} named twice (a backend runs once, one row); "
                          "name each once")
    return backends


def backend_module(backend: Backend) -> ModuleType:
    """The module holding ``backend``'s build and runner, imported on first use.

    Deferred on purpose: the backend modules import torch and their optional runtimes, and the
    CLI reads this registry for its help before any of them is needed.
    """
    return importlib.import_module(f"{__name__}.{backend.module}")


@dataclass(frozen=True)
class RunnerSources:
    """What a backend's runner can be made from; ``model`` builds the PyTorch model on demand.

    Attributes:
        spec: the pass spec every runner follows.
        device: the torch device of the run ('cpu', 'cuda').
        model: ``model(ops)`` returns the PyTorch model in the spec's precision, with the fused
            kernels when ``ops == 'plugins'`` (built once by the caller).
        manifest / directory: the export (None for a model-only run such as ``wan-trt stream``).
        engines: engine files by :attr:`Backend.engine_key` (None where not given).
    """

    spec: PassSpec
    device: str
    model: Callable[..., Any]
    manifest: Manifest | None = None
    directory: Path | None = None
    engines: dict[str, Path | None] | None = None

    def engine(self, backend: Backend) -> Path:
        """``backend``'s engine file (its ``engine`` requirement is checked before the runner is made)."""
        return (self.engines or {})[backend.engine_key]


def missing_engine(backend: Backend, engines: dict[str, Path | None] | None) -> str | None:
    """Why ``backend`` has no engine among ``engines`` (by engine key) if it runs one; None if it has or runs none."""
    if "engine" not in backend.requires or (engines or {}).get(backend.engine_key) is not None:
        return None
    how = "wan-trt build DIR" + ("" if backend.module == "tensorrt" else " --backend aoti") + \
        ("" if backend.ops == "native" else f" --ops {backend.ops}")  # else its flag refuses the engine
    return f"no {backend.engine_flag} given (build one with `{how}`)"


def why_not(backend: Backend, sources: RunnerSources) -> str | None:
    """Why ``backend``'s registered requirements are not met here (None: they are), checked in order."""
    for need in backend.requires:
        if need == "tensorrt":
            try:
                backend_module(backend).import_tensorrt()
            except WanTrtError as exc:
                return str(exc)
        if need == "engine" and (missing := missing_engine(backend, sources.engines)) is not None:
            return missing
        if need == "cuda" and not str(sources.device).startswith("cuda"):
            what = "the fused Triton kernels need" if backend.module == "torch" else "CUDA graphs need"
            return f"{what} a CUDA device (--device cuda)"
    return None


def make_runner(name: str, sources: RunnerSources):
    """The runner of backend ``name`` over ``sources``; :class:`Unavailable` says why it cannot run here."""
    backend = get_backend(name)
    reason = why_not(backend, sources)
    if reason is not None:
        raise Unavailable(reason)
    return backend_module(backend).make_runner(backend, sources)
