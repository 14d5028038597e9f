"""``wan-trt build`` / ``wan-trt inspect``: one entry over the registered backends that build an engine."""
from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Callable

from wan_trt.config import WanConfig
from wan_trt.config_load import load_config, preset_names
from wan_trt.decoder_spec import DecoderSpec
from wan_trt.digest import verify_file
from wan_trt.engines.artifact import REBUILD, EngineMetadata
from wan_trt.engines.backends import BUILDABLE, DEFAULT_BUILD, backend_module, check_engine_name, get_backend
from wan_trt.errors import WanTrtError
from wan_trt.export.writer import DEFAULT_OPSET
from wan_trt.log import logger
from wan_trt.export.decoder import decoder_dirs, read_decoder
from wan_trt.export.manifest import Manifest
from wan_trt.export.transformer import export_transformer
from wan_trt.graphs import graph_kind
from wan_trt.outputs import check_input_file


def resolve_export(directory: str | None, config_name: str | None, precision: str | None, ops: str, *,
                   weights: str | None = None, seed: int | None = None, backend: str = "tensorrt",
                   before_export: Callable[[str], None] | None = None) -> Path:
    """The export directory to build from; with ``--config`` and no directory, export it first.

    ``precision``, ``weights`` and ``seed`` are None when not given; given, they must be the export's (an existing
    export is never rebuilt from other weights than the user named, nor silently used instead). An export
    ``--config`` makes is bf16 unless ``precision`` says otherwise.
    ``before_export(precision)`` refuses, before an export of ``precision`` is made (minutes at full size), what the
    build would refuse after it (the backend's :func:`check_options`).
    """
    if directory is None:
        if config_name is None:
            raise WanTrtError("give an export DIRECTORY (from `wan-trt export`) or --config to export one")
        cfg = load_config(config_name)
        precision = precision or DEFAULT_PRECISION
        path = Path(f"out/{cfg.name}_{precision}_{ops}")
        if not (path / "manifest.json").is_file():
            empty_folder = path.is_dir() and not any(path.iterdir())
            if (path.exists() or path.is_symlink()) and not empty_folder:  # the export would be refused there
                raise WanTrtError(f"--config {config_name}: build exports it into {path} first, which holds no export "
                                  "(files of yours, or another command's output); move them away, or export it "
                                  f"yourself: `wan-trt export --config {config_name} --precision {precision} --ops "
                                  f"{ops} --out DIR`, then `wan-trt build DIR`")
            if before_export is not None:
                before_export(precision)
            export_transformer(cfg, path, precision, weights, 0 if seed is None else seed, ops)
            return path
    path = Path(directory) if directory is not None else path
    manifest = Manifest.read(path)
    if directory is not None and config_name is not None:
        check_config_flag(path, manifest.spec.config, config_name)
    elif directory is None and manifest.spec.config != cfg:  # the export this --config made before, since edited
        raise WanTrtError(f"--config {config_name}: {path} holds an export of config {cfg.name!r} as it was "
                          f"before (the config differs now); re-export it with `wan-trt export --config "
                          f"{config_name} --precision {precision} --ops {ops} --out {path} --overwrite`, then build")
    if precision is not None and manifest.spec.precision != precision:
        again = export_command(manifest, backend == "tensorrt", precision=precision)  # TensorRT parses the graph
        raise WanTrtError(f"{path} holds a {manifest.spec.precision} graph but --{precision} was asked: export one "
                          f"with `{again}` or build with --{manifest.spec.precision}")
    kind = graph_kind(manifest.spec)
    if ops != "native" and not kind.fused_ops:
        raise WanTrtError(f"--ops {ops}: {path} holds a graph of the {kind.name}, which has no fused ops; build it "
                          "with --ops native (the default)")
    if manifest.ops != ops and backend == "tensorrt":  # AOTInductor picks its ops itself
        if isinstance(manifest.spec, DecoderSpec):
            raise WanTrtError(f"--ops {ops}: {path} is a graph of the video decoder, whose ONNX graphs have no fused "
                              "ops (a TensorRT engine runs the graph as exported); its fused norms are an AOTInductor "
                              f"build's: `wan-trt build {path.parent} --backend aoti --ops plugins`, or drop --ops")
        raise WanTrtError(f"{path} holds a --ops {manifest.ops} graph but --ops {ops} was asked; export one with "
                          f"`{export_command(manifest, True, ops=ops)}`")
    check_weight_flags(path, manifest, weights, seed)
    return path


def export_command(manifest: Manifest, graph: bool = False, out: Path | None = None, **changed: Any) -> str:
    """The `wan-trt export` command that makes ``manifest``'s export again with the ``changed`` flags (precision, ops,
    weights, seed), into ``out`` (replacing the export there; None: a folder of the user's), with an ONNX graph where
    the export has one or ``graph`` asks for one (a TensorRT build's). A decoder graph's command makes both of its
    graphs, into the folder above its own. A config of a file, which its name does not find, is CONFIG_FILE_OF_<name>:
    a placeholder a shell takes as one word."""
    spec, recorded = manifest.spec, manifest.weights
    decoder = isinstance(spec, DecoderSpec)
    preset = spec.config.name in preset_names()
    onnx = graph or manifest.graph is not None
    flags = {"config": spec.config.name if preset else f"CONFIG_FILE_OF_{spec.config.name}",
             "graph": spec.KIND if decoder else None,
             "precision": spec.precision, "ops": None if decoder or not onnx else manifest.ops,
             "opset": manifest.opset if onnx and manifest.opset != DEFAULT_OPSET else None,
             "weights": recorded.get("path"), "seed": recorded["seed"],
             **{k: v for k, v in changed.items() if v is not None}}
    names = {"weights": graph_kind(spec).weights_flag}
    line = " ".join(f"{names.get(k, '--' + k)} {v}" for k, v in flags.items() if v is not None)
    where = "DIR" if out is None else f"{out.parent if decoder else out} --overwrite"
    return f"wan-trt export {line}{'' if onnx else ' --no-onnx'} --out {where}"


def check_config_flag(path: Path, exported: WanConfig, config_name: str) -> None:
    """Refuse a ``--config`` other than the one the export at ``path`` was made from."""
    if load_config(config_name) != exported:
        raise WanTrtError(f"--config {config_name}: {path} was exported from config {exported.name!r}; drop "
                          f"--config to build that export, or export {config_name} first")


def check_weight_flags(path: Path, manifest: Manifest, weights: str | None, seed: int | None) -> None:
    """Refuse ``--weights`` / ``--seed`` that disagree with what the export at ``path`` was made from."""
    recorded = manifest.weights
    fix = f"re-export with `{export_command(manifest, out=path, weights=weights, seed=seed)}`, or drop the flag"
    if weights is not None:
        check_input_file(weights, "--weights")
        if recorded["source"] != "checkpoint":
            raise WanTrtError(f"--weights {weights}: {path} was exported with random weights (seed "
                              f"{recorded['seed']}), not from a checkpoint; {fix}")
        if not manifest.made_from(weights):
            raise WanTrtError(f"--weights {weights}: {path} was exported from another checkpoint "
                              f"({recorded['path']}, other contents); {fix}")
    if seed is not None and seed != recorded["seed"]:
        raise WanTrtError(f"--seed {seed}: {path} was exported with --seed {recorded['seed']}; {fix}")


DEFAULT_PRECISION = "bf16"  # of the export `build --config` makes when no precision is given


@dataclass(frozen=True)
class BuildOptions:
    """What `wan-trt build` was asked for, beside the export to build from."""

    backend: str = DEFAULT_BUILD
    precision: str | None = None  # None: the export's (bf16 for one --config makes)
    ops: str = "native"
    device: str = "cuda"
    timing_cache: str | None = None
    opt_level: int = 3
    weak_typing: bool = False
    out: str | None = None
    force: bool = False


def build_engine(directory: str | None, config_name: str | None, options: BuildOptions, *,
                 weights: str | None = None, seed: int | None = None) -> Path:
    """Build (or reuse, when up to date and verified) the engine of an export; returns its path."""
    if options.backend not in BUILDABLE:
        raise WanTrtError(f"--backend {options.backend}: not an engine that `wan-trt build` makes; "
                          f"expected one of {', '.join(BUILDABLE)}")
    backend = get_backend(options.backend)
    if directory is not None and decoder_dirs(directory) is not None:
        if config_name is not None:
            check_config_flag(Path(directory), read_decoder(directory)["steady"].spec.config, config_name)
        if weights is not None:
            kind = read_decoder(directory)["steady"].spec.KIND
            raise WanTrtError(f"--weights {weights}: {directory} is a decoder export, whose weights were fixed at "
                              f"export (`wan-trt export --graph {kind} --vae-weights`); drop --weights")
        return build_decoder_engines(Path(directory), backend, options, seed=seed)
    if options.out is not None:  # before an export --config may make (minutes)
        check_engine_name(backend, Path(options.out))
    module = backend_module(backend)

    def before_export(precision: str) -> None:  # the options of the export --config makes
        module.check_options(replace(options, precision=precision))
    export_dir = resolve_export(directory, config_name, options.precision, options.ops, weights=weights, seed=seed,
                                backend=backend.name, before_export=before_export)
    return module.build(export_dir, options)


def build_decoder_engines(directory: Path, backend, options: BuildOptions, *, seed: int | None = None) -> Path:
    """The decoder's two engines, one beside each of its graphs (same file name); returns the steady one's path."""
    if options.out is not None:
        raise WanTrtError(f"--out {options.out}: a decoder's engines are written beside its two graphs "
                          f"({directory}/first, {directory}/steady); drop --out")
    read_decoder(directory)  # both exports verified, and one decoder's
    engines = {}
    for call, export_dir in decoder_dirs(directory).items():
        resolve_export(str(export_dir), None, options.precision, options.ops, seed=seed, backend=backend.name)
        engines[call] = backend_module(backend).build(export_dir, options)
        logger.info("decoder %s engine: %s", call, engines[call])
    return engines["steady"]


def inspect_engine(engine: str | Path) -> dict[str, Any]:
    """Layers (TensorRT) or kernels (AOTInductor) of an engine, with the custom-op count."""
    engine = Path(engine)
    meta = EngineMetadata.read(engine)
    verify_file(engine, meta.engine_file, f"{REBUILD} --force")  # the engine that was built, not another file
    return backend_module(get_backend(meta.backend)).inspect(engine, meta)
