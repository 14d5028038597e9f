"""``wan-trt build`` / ``wan-trt inspect``: one entry over the TensorRT and AOTInductor backends."""
from __future__ import annotations

import zipfile
from pathlib import Path
from typing import Any

from wan_trt.engines.artifact import EngineMetadata
from wan_trt.errors import WanTrtError
from wan_trt.export.manifest import Manifest


def resolve_export(directory: str | None, config_name: str | None, precision: str, ops: str,
                   weights: str | None, seed: int, backend: str = "tensorrt") -> Path:
    """The export directory to build from; with ``--config`` and no directory, export it first."""
    if directory is None:
        if config_name is None:
            raise WanTrtError("give an export DIRECTORY (from `wan-trt export`) or --config to export one")
        from wan_trt.config import load_config
        from wan_trt.export.transformer import export_transformer
        cfg = load_config(config_name)
        path = Path(f"out/{cfg.name}_{precision}_{ops}")
        if not (path / "manifest.json").is_file():
            export_transformer(cfg, path, precision, weights, seed, ops)
        return path
    path = Path(directory)
    manifest = Manifest.read(path)
    if manifest.spec.precision != precision:
        raise WanTrtError(f"{path} holds a {manifest.spec.precision} graph but --{precision} was asked: re-export "
                          f"with `wan-trt export --precision {precision}` or build with --{manifest.spec.precision}")
    if manifest.ops != ops and backend == "tensorrt":  # AOTInductor picks its ops itself
        raise WanTrtError(f"{path} holds a --ops {manifest.ops} graph but --ops {ops} was asked; re-export")
    return path


def build_engine(directory, config_name, backend, precision, ops, device, timing_cache, opt_level, weak_typing, out,
                 force, weights, seed) -> Path:
    export_dir = resolve_export(directory, config_name, precision, ops, weights, seed, backend)
    if backend == "aoti":
        from wan_trt.engines.aoti import build_aoti
        return build_aoti(export_dir, out, device, force, ops)
    from wan_trt.engines.tensorrt import build_tensorrt
    return build_tensorrt(export_dir, out, opt_level, timing_cache, weak_typing, force)


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
