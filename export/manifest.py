"""The manifest of an exported graph: spec, files, provenance. Written last, read first.

``manifest.json`` alone is enough for a runtime to allocate every buffer (it holds the
whole :class:`~wan_trt.spec.PassSpec`), and it says where the weights came from so a
check can rebuild the same PyTorch reference.
"""
from __future__ import annotations

import json
import platform
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from wan_trt.errors import WanTrtError
from wan_trt.spec import PassSpec

MANIFEST = "manifest.json"
GRAPH = "model.onnx"
SAMPLE_INPUTS = "sample_inputs.safetensors"


def tool_versions() -> dict[str, str]:
    import onnx
    import torch

    versions = {"python": platform.python_version(), "torch": torch.__version__, "onnx": onnx.__version__}
    for name in ("onnxscript", "onnxruntime", "tensorrt"):
        try:
            versions[name] = __import__(name).__version__
        except ImportError:
            pass
    from importlib.metadata import PackageNotFoundError, version
    try:
        versions["wan_trt"] = version("wan-trt")
    except PackageNotFoundError:
        versions["wan_trt"] = "source"
    return versions


@dataclass
class Manifest:
    """What ``wan-trt export`` wrote into a directory."""

    spec: PassSpec
    ops: str
    opset: int
    weights: dict[str, Any]  # source, seed or checkpoint path, sha256 of the graph's weights
    graph: str | None = GRAPH  # None: exported with --no-onnx (enough for AOTInductor engines)
    external_data: str | None = None
    sample_inputs: str = SAMPLE_INPUTS
    op_counts: dict[str, int] = field(default_factory=dict)
    versions: dict[str, str] = field(default_factory=tool_versions)
    export_seconds: float | None = None

    def to_dict(self) -> dict[str, Any]:
        return {"spec": self.spec.to_dict(), "fingerprint": self.spec.fingerprint(), "ops": self.ops,
                "opset": self.opset, "weights": self.weights, "graph": self.graph,
                "external_data": self.external_data, "sample_inputs": self.sample_inputs,
                "op_counts": self.op_counts, "versions": self.versions, "export_seconds": self.export_seconds}

    def write(self, directory: Path) -> Path:
        path = Path(directory) / MANIFEST
        path.write_text(json.dumps(self.to_dict(), indent=2))
        return path

    def graph_path(self, directory: str | Path) -> Path:
        """The ONNX graph's path; a clear error for an export made without one."""
        if self.graph is None:
            raise WanTrtError(f"{directory} was exported with --no-onnx: it has no ONNX graph (ONNX Runtime and "
                              "TensorRT need one); re-export without --no-onnx")
        return Path(directory) / self.graph

    @classmethod
    def read(cls, directory: str | Path) -> "Manifest":
        """Load and check a manifest; every file it names must exist."""
        directory = Path(directory)
        path = directory / MANIFEST
        if not path.is_file():
            raise WanTrtError(f"{directory} holds no {MANIFEST}: not a finished `wan-trt export` directory")
        data = json.loads(path.read_text())
        manifest = cls(spec=PassSpec.from_dict(data["spec"]), ops=data["ops"], opset=data["opset"],
                       weights=data["weights"], graph=data["graph"], external_data=data.get("external_data"),
                       sample_inputs=data["sample_inputs"], op_counts=data.get("op_counts", {}),
                       versions=data.get("versions", {}), export_seconds=data.get("export_seconds"))
        for name in filter(None, (manifest.graph, manifest.external_data, manifest.sample_inputs)):
            if not (directory / name).is_file():
                raise WanTrtError(f"{directory / name} is missing: the export is incomplete; re-export")
        return manifest


def reference_model(manifest: "Manifest", dtype, device):
    """The PyTorch model holding the graph's weights (same seed or checkpoint), in ``dtype`` on ``device``."""
    from wan_trt.model import build_model

    w = manifest.weights
    path = w.get("path") if w["source"] == "checkpoint" else None
    if path and not Path(path).is_file():
        raise WanTrtError(f"the graph's checkpoint {path} is not on this machine; the check needs it to "
                          "rebuild the PyTorch reference")
    return build_model(manifest.spec.config, dtype, device, path, w.get("seed", 0))


def verify_weights(manifest: "Manifest", model) -> None:
    """Fail if ``model`` (in the graph's precision) does not hold the weights the graph was exported with."""
    from wan_trt.model.checkpoint import weights_fingerprint

    if weights_fingerprint(model) != manifest.weights["sha256"]:
        raise WanTrtError("the rebuilt PyTorch reference does not hold the graph's weights (checkpoint changed "
                          "since export?); re-export")
