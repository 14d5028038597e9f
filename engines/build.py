"""``wan-trt build`` / ``wan-trt inspect``: one entry over the TensorRT and AOTInductor backends."""
from __future__ import annotations

import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from wan_trt.engines.artifact import EngineMetadata
from wan_trt.digest import file_digest
from wan_trt.errors import WanTrtError
from wan_trt.export.manifest import Manifest


def resolve_export(directory: str | None, config_name: str | None, precision: str, ops: str, *,
                   weights: str | None = None, seed: int | None = None, backend: str = "tensorrt") -> Path:
    """The export directory to build from; with ``--config`` and no directory, export it first.

    ``weights`` / ``seed`` are None when not given; given, they must be the export's (an existing
    export is never rebuilt from other weights than the user named, nor silently used instead).
    """
    if directory is None:
        if config_name is None:
            raise WanTrtError("give an export DIRECTORY (from `wan-trt export`) or --config to export one")
        from wan_trt.config import load_config
        from wan_trt.export.transformer import export_transformer
        cfg = load_config(config_name)
        path = Path(f"out/{cfg.name}_{precision}_{ops}")
        if not (path / "manifest.json").is_file():
            export_transformer(cfg, path, precision, weights, 0 if seed is None else seed, ops)
            return path
    path = Path(directory) if directory is not None else path
    manifest = Manifest.read(path)
    if manifest.spec.precision != precision:
        raise WanTrtError(f"{path} holds a {manifest.spec.precision} graph but --{precision} was asked: re-export "
                          f"with `wan-trt export --precision {precision}` or build with --{manifest.spec.precision}")
    if manifest.ops != ops and backend == "tensorrt":  # AOTInductor picks its ops itself
        raise WanTrtError(f"{path} holds a --ops {manifest.ops} graph but --ops {ops} was asked; re-export")
    check_weight_flags(path, manifest, weights, seed)
    return path


def check_weight_flags(path: Path, manifest: Manifest, weights: str | None, seed: int | None) -> None:
    """Refuse ``--weights`` / ``--seed`` that disagree with what the export at ``path`` was made from."""
    recorded = manifest.weights
    fix = f"re-export with `wan-trt export --out {path} --overwrite` and these flags, or drop them"
    if weights is not None:
        if recorded["source"] != "checkpoint":
            raise WanTrtError(f"--weights {weights}: {path} was exported with random weights (seed "
                              f"{recorded['seed']}), not from a checkpoint; {fix}")
        if not Path(weights).is_file():
            raise WanTrtError(f"--weights {weights}: no such file")
        if file_digest(weights)["sha256"] != recorded["file_sha256"]:
            raise WanTrtError(f"--weights {weights}: {path} was exported from another checkpoint "
                              f"({recorded['path']}, other contents); {fix}")
    if seed is not None and seed != recorded["seed"]:
        raise WanTrtError(f"--seed {seed}: {path} was exported with --seed {recorded['seed']}; {fix}")


@dataclass(frozen=True)
class BuildOptions:
    """What `wan-trt build` was asked for, beside the export to build from."""

    backend: str = "tensorrt"
    precision: str = "bf16"
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
    o = options
    export_dir = resolve_export(directory, config_name, o.precision, o.ops, weights=weights, seed=seed,
                                backend=o.backend)
    if o.backend == "aoti":
        from wan_trt.engines.aoti import build_aoti
        return build_aoti(export_dir, o.out, o.device, o.force, o.ops)
    from wan_trt.engines.tensorrt import build_tensorrt
    return build_tensorrt(export_dir, o.out, o.opt_level, o.timing_cache, o.weak_typing, o.force)


def inspect_engine(engine: str | Path) -> dict[str, Any]:
    """Layers (TensorRT) or kernels (AOTInductor) of an engine, with the custom-op count."""
    engine = Path(engine)
    meta = EngineMetadata.read(engine)
    if meta.backend == "tensorrt":
        from wan_trt.engines.tensorrt import inspect_tensorrt
        info = inspect_tensorrt(engine)
        return {"summary": {"backend": "tensorrt", **info["counts"], "plugins": info["plugin_layers"]}, **info}
    return inspect_aoti(engine, meta)


def inspect_aoti(engine: Path, meta: EngineMetadata) -> dict[str, Any]:
    """Files, generated kernels and wan-trt custom kernels inside an AOTInductor package."""
    with zipfile.ZipFile(engine) as pkg:
        names = pkg.namelist()
        sources = [n for n in names if n.endswith((".cpp", ".py", ".wrapper.cpp"))]
        text = "\n".join(pkg.read(n).decode(errors="ignore") for n in sources)
    kernels = sorted({n.rsplit("/", 1)[-1].split(".")[0] for n in names if n.endswith((".cubin", ".ptx", ".hsaco"))})
    custom = sorted({line.split("(")[0].strip() for line in text.splitlines() if "wan_trt" in line and "(" in line})
    summary = {"backend": "aoti", "device": meta.device, "config": meta.config, "precision": meta.precision,
               "files": len(names), "gpu_kernels": len(kernels), "wan_trt_custom_op_lines": len(custom)}
    return {"summary": summary, "files": names, "kernels": kernels, "custom_ops": custom[:200]}
