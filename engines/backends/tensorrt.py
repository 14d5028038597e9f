"""TensorRT engine build and inspection (TensorRT 10.9+ and 11.x Python API).

TensorRT 11 builds strongly typed networks only: the precision lives in the ONNX graph
(bf16 or fp16 tensors with fp32 islands), so the network is created STRONGLY_TYPED and
no precision flag is set. On TensorRT 10.x the same strongly typed build is the default;
``weak_typing=True`` instead builds an untyped network with the BF16/FP16 builder flag
(and OBEY_PRECISION_CONSTRAINTS), as 10.x users may expect.

Everything that can be checked without TensorRT (manifest, files, flags, plugins) is
checked before TensorRT is imported; without TensorRT the build stops with a message
naming what to install. Nothing here is faked: no engine is written unless TensorRT
built it.
"""
from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import torch

from wan_trt.engines.artifact import (EngineMetadata, check_engine_out, check_unchanged, default_engine_path,
                                     engine_key, install_engine, staged_file, up_to_date)
from wan_trt.engines.backends import check_engine_name, get_backend
from wan_trt.engines.runtime.runner import Runner
from wan_trt.engines.runtime.runtime_file import write_runtime_file
from wan_trt.digest import file_identity
from wan_trt.errors import WanTrtError
from wan_trt.export.manifest import Manifest
from wan_trt.log import stage
from wan_trt.outputs import output_lock, parent_made, write_file
from wan_trt.owned import owned_export_files

MIN_VERSION = (10, 9)
# TensorRT 10.x untyped networks (--weak-typing): the builder flags each precision needs. fp8: the
# FP8 GEMMs come from the graph's Q/DQ; everything else runs in bf16.
WEAK_TYPING_FLAGS = {"bf16": ("BF16",), "fp16": ("FP16",), "fp32": (), "fp8": ("BF16", "FP8")}


def import_tensorrt():
    """The tensorrt module, or a WanTrtError saying what to install."""
    try:
        import tensorrt as trt
    except ImportError:
        raise WanTrtError(
            "TensorRT is not installed: `pip install tensorrt` (10.9 or newer; it needs NVIDIA's package index "
            "and a CUDA GPU). Other backends: `wan-trt build DIR --backend aoti`, or `wan-trt check DIR` with "
            "ONNX Runtime.") from None
    if tuple(int(x) for x in trt.__version__.split(".")[:2]) < MIN_VERSION:
        raise WanTrtError(f"TensorRT {trt.__version__} is too old: wan-trt needs {'.'.join(map(str, MIN_VERSION))}+")
    return trt


def register_plugins() -> None:
    """Register the wan_trt::* plugin creators with TensorRT (for --ops plugins engines)."""
    # deferred: the plugin module imports the Triton kernels, needed only by --ops plugins engines
    from wan_trt.plugins.tensorrt_plugins import register_plugins as register
    register()


# ONNX ops an opset-23 export writes that TensorRT's ONNX parser reads only from these versions on (NVIDIA/TensorRT
# CHANGELOG.md: Attention in 10.14, RMSNormalization in 10.15); --opset 18 decomposes them for older parsers
PARSER_OPS_SINCE = {"Attention": (10, 14), "RMSNormalization": (10, 15)}


def check_parser_ops(version: str, op_counts: dict[str, int]) -> None:
    """Refuse a graph with ops TensorRT ``version``'s ONNX parser does not read (``op_counts``: the manifest's),
    before minutes of parsing end in its error."""
    have = tuple(int(x) for x in version.split(".")[:2])
    missing = {op: since for op, since in PARSER_OPS_SINCE.items() if op_counts.get(op) and have < since}
    if missing:
        needs = ", ".join(f"{op} from {'.'.join(map(str, since))}" for op, since in missing.items())
        raise WanTrtError(f"the graph has ONNX ops TensorRT {version}'s parser does not read ({needs}): re-export "
                          f"it with `--opset 18` (decomposed), or use TensorRT "
                          f"{'.'.join(map(str, max(missing.values())))} or newer")


def check_weak_typing(version: str, weak_typing: bool) -> None:
    """Refuse ``--weak-typing`` under TensorRT 11, which removed weak typing together with the precision builder
    flags it sets (BF16, FP16, FP8, OBEY_PRECISION_CONSTRAINTS); ``version`` is ``tensorrt.__version__``."""
    if weak_typing and int(version.split(".")[0]) >= 11:
        raise WanTrtError(f"--weak-typing: TensorRT {version} builds strongly typed networks only (TensorRT 11 "
                          "removed weak typing and its precision flags); drop --weak-typing, the graph's own types "
                          "are the precision")


def check_options(options) -> None:
    """What ``wan-trt build`` (a BuildOptions) cannot build here, refused before an export is made: TensorRT itself."""
    import_tensorrt()


def _check_inputs(manifest: Manifest, directory: Path, opt_level: int, timing_cache: Path | None) -> None:
    if not 0 <= opt_level <= 5:
        raise WanTrtError(f"--opt-level {opt_level}: expected 0..5")
    if timing_cache is not None:  # read as a cache, then replaced by the build's: never a file of anything else's
        if not timing_cache.parent.is_dir():
            raise WanTrtError(f"--timing-cache {timing_cache}: folder {timing_cache.parent} does not exist")
        if timing_cache.is_symlink() or (timing_cache.exists() and not timing_cache.is_file()):
            raise WanTrtError(f"--timing-cache {timing_cache} is a symbolic link, a folder or no regular file; name "
                              "the cache file itself")
        if timing_cache.resolve() in {p.resolve() for p in owned_export_files(directory) or []}:
            raise WanTrtError(f"--timing-cache {timing_cache} is a file of the export (the build would replace it "
                              "with its timing cache); pick a path of its own, e.g. out/timing.cache")
    if manifest.ops == "plugins":
        # deferred like register_plugins; imported here to fail early if the plugin code is missing
        from wan_trt.plugins import tensorrt_plugins  # noqa: F401


def build_tensorrt(directory: str | Path, out: str | Path | None = None, opt_level: int = 3,
                   timing_cache: str | Path | None = None, weak_typing: bool = False, force: bool = False) -> Path:
    """Build a TensorRT engine from the export in ``directory``; returns the engine path."""
    directory = Path(directory)
    manifest = Manifest.read(directory)
    cache_path = Path(timing_cache) if timing_cache else None
    _check_inputs(manifest, directory, opt_level, cache_path)
    engine = Path(out) if out else default_engine_path(directory, "tensorrt", "cuda")
    check_engine_name(get_backend("tensorrt"), engine)
    check_engine_out(engine)
    manifest.graph_path(directory)  # a --no-onnx export has no graph to parse: said before TensorRT is looked for
    trt = import_tensorrt()
    check_weak_typing(trt.__version__, weak_typing)  # before any of the flags it would set is looked up
    check_parser_ops(trt.__version__, manifest.op_counts)
    key = engine_key(manifest, "tensorrt", "cuda", {"opt_level": opt_level, "weak_typing": weak_typing})
    with parent_made(engine, "--out"), output_lock(engine, "build"):  # a failed build leaves no folder it made
        if force or not up_to_date(engine, key, manifest):
            _build(trt, manifest, directory, engine, key, opt_level=opt_level, cache_path=cache_path,
                   weak_typing=weak_typing)
        meta = EngineMetadata.read(engine)  # verified or just made
        write_runtime_file(manifest, engine, meta.engine_file, meta.device)
    return engine


def _build(trt, manifest: Manifest, directory: Path, engine: Path, key: str, *, opt_level: int,
           cache_path: Path | None, weak_typing: bool) -> None:
    """Parse the graph, build the serialized engine and install it at ``engine`` (staged, then renamed)."""
    begin = time.perf_counter()
    if manifest.ops == "plugins":
        register_plugins()
    trt_logger = trt.Logger(trt.Logger.WARNING)
    builder = trt.Builder(trt_logger)
    config = builder.create_builder_config()
    if not config.set_timing_cache(timing_cache(trt, config, cache_path), ignore_mismatch=False):  # before the parse
        raise WanTrtError(f"--timing-cache {cache_path}: TensorRT {trt.__version__} refused this cache (made on "
                          "another GPU, whose CUDA device properties differ), and the build would replace it with "
                          "its own; name another file for this GPU")
    config.builder_optimization_level = opt_level
    config.clear_flag(trt.BuilderFlag.TF32)  # fp32 in the graph stays fp32 (TensorRT rounds it to TF32 by default)
    # the inspector reports layer types (what `inspect` counts plugin layers by) only in a DETAILED engine: the
    # default, LAYER_NAMES_ONLY, gives names alone
    config.profiling_verbosity = trt.ProfilingVerbosity.DETAILED
    if weak_typing:
        for flag in WEAK_TYPING_FLAGS[manifest.spec.precision]:
            config.set_flag(getattr(trt.BuilderFlag, flag))
        config.set_flag(trt.BuilderFlag.OBEY_PRECISION_CONSTRAINTS)
    network = _parse(trt, builder, trt_logger, manifest.graph_path(directory), weak_typing)
    # the parser read the files by their paths
    manifest.require_graph_verified(directory, "after it was verified (before or while TensorRT parsed it)")
    with stage(f"TensorRT {trt.__version__} build (opt level {opt_level})"):
        serialized = builder.build_serialized_network(network, config)
    if serialized is None:
        raise WanTrtError("TensorRT could not build the engine (see its log above)")
    with staged_file(engine) as partial:
        partial.write_bytes(bytes(serialized))
        meta = EngineMetadata.of_build(manifest, directory, backend="tensorrt", device="cuda", key=key,
                                       ops=manifest.ops, build_seconds=time.perf_counter() - begin,
                                       extra={"opt_level": opt_level, "weak_typing": weak_typing,
                                              "layers": inspect_tensorrt(partial)["counts"]})
        install_engine(partial, engine, meta)
    if cache_path:
        write_file(cache_path, bytes(config.get_timing_cache().serialize()))


def timing_cache(trt, config, path: Path | None):
    """The build's timing cache, started from the file at ``path`` when there is one. The build writes its cache
    over that file, so the file must hold a timing cache this TensorRT reads: a file of anything else (named by
    mistake) or a cache of another TensorRT version (whose entries TensorRT skips) is refused, not replaced."""
    data = path.read_bytes() if path is not None and path.is_file() else b""
    try:
        cache = config.create_timing_cache(data)
        empty = bytes(config.create_timing_cache(b"").serialize())
        read = cache is not None and (len(cache.queryKeys()) > 0 or data in (b"", empty))
    except Exception:  # a blob TensorRT rejects outright  # noqa: BLE001
        read = False
    if not read:
        raise WanTrtError(f"--timing-cache {path}: this file is no timing cache TensorRT {trt.__version__} reads "
                          "(another file, or a cache of another TensorRT version), and the build would replace it "
                          "with its own; name a new file or remove this one")
    return cache


def _parse(trt, builder, trt_logger, graph: Path, weak_typing: bool):
    flags = 0 if weak_typing else 1 << int(trt.NetworkDefinitionCreationFlag.STRONGLY_TYPED)
    prefer_aot = getattr(trt.NetworkDefinitionCreationFlag, "PREFER_AOT_PYTHON_PLUGINS", None)
    if prefer_aot is not None:  # every fused node is exported aot=1; a node read without it still takes its AOT form
        flags |= 1 << int(prefer_aot)
    network = builder.create_network(flags)
    parser = trt.OnnxParser(network, trt_logger)
    with stage(f"parse {graph.name}"):
        ok = parser.parse_from_file(str(graph))  # finds model.onnx.data beside the graph
    if not ok:
        errors = [str(parser.get_error(i)) for i in range(parser.num_errors)]
        raise WanTrtError("TensorRT's ONNX parser refused the graph:\n  " + "\n  ".join(errors[:20]))
    return network


def inspect_tensorrt(engine: str | Path) -> dict[str, Any]:
    """Layers of a serialized engine and how many are plugins (needs TensorRT)."""
    trt = import_tensorrt()
    runtime = trt.Runtime(trt.Logger(trt.Logger.WARNING))
    deserialized = runtime.deserialize_cuda_engine(Path(engine).read_bytes())
    if deserialized is None:
        raise WanTrtError(f"{engine}: TensorRT cannot deserialize it (built by another TensorRT version?)")
    inspector = deserialized.create_engine_inspector()
    info = json.loads(inspector.get_engine_information(trt.LayerInformationFormat.JSON))
    layers = [layer if isinstance(layer, dict) else {"Name": layer} for layer in info.get("Layers", [])]
    plugins = [layer for layer in layers if "Plugin" in str(layer.get("LayerType", ""))]
    return {"layers": layers, "counts": {"layers": len(layers), "plugin_layers": len(plugins)},
            "plugin_layers": [p.get("Name") for p in plugins]}


def torch_dtypes(trt) -> dict[Any, torch.dtype]:
    """TensorRT's data types that have a torch dtype, mapped to it (the engines' I/O, the plugins' tensors)."""
    return {trt.float32: torch.float32, trt.float16: torch.float16, trt.bfloat16: torch.bfloat16,
            trt.int32: torch.int32, trt.int64: torch.int64, trt.bool: torch.bool}


def io_mismatches(spec, shapes: dict[str, tuple[int, ...]], dtypes: dict[str, torch.dtype | None]) -> list[str]:
    """What differs between the spec's I/O and an engine's (its tensors' ``shapes`` and torch ``dtypes``, None for a
    TensorRT type without one), by tensor, in the spec's order."""
    problems = []
    for t in (*spec.inputs, *spec.outputs):
        if tuple(shapes[t.name]) != tuple(t.shape):
            problems.append(f"{t.name}: shape {list(shapes[t.name])}, the spec's {list(t.shape)}")
        if dtypes[t.name] != t.torch_dtype:
            problems.append(f"{t.name}: dtype {dtypes[t.name]}, the spec's {t.torch_dtype}")
    return problems


class TensorRTRunner(Runner):
    """Runs a TensorRT engine; outputs are owned buffers (allocated once), inputs bound by address."""

    owns_outputs = True
    without_cuda = ("a TensorRT engine runs on a CUDA GPU only: run it on a machine with one, or build an AOTInductor "
                    "package for this CPU with `wan-trt build EXPORT --backend aoti --device cpu`")

    def __init__(self, engine: str | Path, manifest: Manifest):
        self.engine_path = Path(engine)
        self.verified = file_identity(self.engine_path)  # the file whose sha256 check_against verifies
        EngineMetadata.read(self.engine_path).check_against(manifest, self.engine_path)  # export + engine file
        check_unchanged(self.engine_path, self.verified)
        super().__init__(manifest.spec, "cuda")
        self.weights_sha256 = manifest.weights["sha256"]
        self.ops = manifest.ops
        self.name = "tensorrt"
        self.engine = self.context = None
        self.outputs: dict[str, torch.Tensor] = {}

    def activate(self) -> None:
        trt = import_tensorrt()
        if self.ops == "plugins":
            register_plugins()
        runtime = trt.Runtime(trt.Logger(trt.Logger.WARNING))
        self.engine = runtime.deserialize_cuda_engine(self.engine_bytes())
        if self.engine is None:
            raise WanTrtError(f"{self.engine_path}: TensorRT cannot deserialize it; rebuild with this TensorRT")
        names = {self.engine.get_tensor_name(i) for i in range(self.engine.num_io_tensors)}
        expected = set(self.spec.input_names) | set(self.spec.output_names)
        if names != expected:
            raise WanTrtError(f"{self.engine_path} I/O {sorted(names)} differs from the spec {sorted(expected)}")
        torch_dtype = torch_dtypes(trt)
        problems = io_mismatches(self.spec, {n: tuple(self.engine.get_tensor_shape(n)) for n in expected},
                                 {n: torch_dtype.get(self.engine.get_tensor_dtype(n)) for n in expected})
        if problems:  # its buffers are allocated and bound by the spec: another size is read or written past
            raise WanTrtError(f"{self.engine_path}: its I/O differs from the spec ({'; '.join(problems)}); rebuild it "
                              "with `wan-trt build`")
        self.context = self.engine.create_execution_context()
        if self.context is None:  # e.g. its activation memory could not be allocated (TensorRT logs why)
            raise WanTrtError(f"{self.engine_path}: TensorRT could not create an execution context (see its log)")
        self.outputs = self.spec.allocate("outputs", self.device)

    def engine_bytes(self) -> bytes:
        """The plan's bytes, read from the file verified when the runner was made: refused if it was replaced or
        rewritten since (before and after the read), as a report would give the verified file's sha256."""
        check_unchanged(self.engine_path, self.verified)
        data = self.engine_path.read_bytes()
        check_unchanged(self.engine_path, self.verified)
        return data

    def deactivate(self) -> None:
        self.context = self.engine = None
        self.outputs = {}

    def rebind_output(self, name: str, tensor: torch.Tensor) -> None:
        self.outputs[name] = tensor

    def infer(self, feeds: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        self.check_feeds(feeds)
        for name in self.spec.input_names:
            self.context.set_tensor_address(name, feeds[name].data_ptr())
        for name, tensor in self.outputs.items():
            self.context.set_tensor_address(name, tensor.data_ptr())
        if not self.context.execute_async_v3(torch.cuda.current_stream(self.device).cuda_stream):
            raise WanTrtError("TensorRT execute_async_v3 failed")
        return dict(self.outputs)


# ---- the registry's entry points (engines/backends/__init__.py) ----------------------------------

def build(directory: Path, options) -> Path:
    """``wan-trt build --backend tensorrt``: the engine of the export in ``directory`` (a BuildOptions)."""
    return build_tensorrt(directory, options.out, options.opt_level, options.timing_cache, options.weak_typing,
                          options.force)


def make_runner(backend, sources) -> Runner:
    """The runner of the ``tensorrt`` entry (TensorRT installed and the engine given: checked by the registry)."""
    return TensorRTRunner(sources.engine(backend), sources.manifest)


def check_runners(engine: Path, manifest: Manifest):
    """``wan-trt check ENGINE``: the stream runner, and Polygraphy's own ``TrtRunner`` for the single pass."""
    # polygraphy's TensorRT backend imports tensorrt: deferred, like every TensorRT import here
    from polygraphy.backend.trt import EngineFromBytes, TrtRunner

    backend = TensorRTRunner(engine, manifest)
    if manifest.ops == "plugins":
        register_plugins()
    return backend, TrtRunner(EngineFromBytes(backend.engine_bytes), name="tensorrt")  # the verified file's bytes


def inspect(engine: Path, meta: EngineMetadata) -> dict:
    """Layers and plugin layers of a TensorRT engine, with the summary `wan-trt inspect` prints."""
    info = inspect_tensorrt(engine)
    return {"summary": {"backend": "tensorrt", **info["counts"], "plugins": info["plugin_layers"]}, **info}
