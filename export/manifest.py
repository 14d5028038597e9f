"""The manifest of an exported graph: spec, files, provenance. Written last, read first.

``manifest.json`` alone is enough for a runtime to allocate every buffer (it holds the graph's
whole spec: a :class:`~wan_trt.spec.PassSpec` or :class:`~wan_trt.decoder_spec.DecoderSpec`), and
it says where the weights came from so a check can rebuild the same PyTorch reference.
"""
from __future__ import annotations

import json
import platform
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from wan_trt.digest import bytes_digest, file_digest, file_identity, require_unchanged, verify_file
from wan_trt.errors import WanTrtError
from wan_trt.export.manifest_schema import FORMAT, parse_manifest
from wan_trt.graphs import graph_kind
from wan_trt.model.checkpoint import weights_fingerprint
from wan_trt.owned import GRAPH, MANIFEST, SAMPLE_INPUTS  # noqa: F401  (with the rules telling wan-trt's files apart)
from wan_trt.spec import GraphSpec



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


REMAKE = "re-export it with `wan-trt export --overwrite`"


@dataclass
class Manifest:
    """What ``wan-trt export`` wrote into a directory."""

    spec: GraphSpec
    ops: str
    opset: int
    weights: dict[str, Any]  # source, seed, checkpoint path + file sha256, sha256 of the graph's weights
    graph: str | None = GRAPH  # None: exported with --no-onnx (enough for AOTInductor engines)
    external_data: str | None = None
    sample_inputs: str = SAMPLE_INPUTS
    op_counts: dict[str, int] = field(default_factory=dict)
    versions: dict[str, str] = field(default_factory=tool_versions)
    export_seconds: float | None = None
    files: dict[str, dict[str, Any]] = field(default_factory=dict)  # name -> {size, sha256}, filled by write()
    sha256: str | None = field(default=None, compare=False)  # of manifest.json as written / read
    # file name -> its file_identity when verify_files hashed it: what a later read of it must still find
    verified: dict[str, tuple] = field(default_factory=dict, compare=False, repr=False)

    def file_names(self) -> list[str]:
        """The files this export wrote besides manifest.json."""
        return [n for n in (self.graph, self.external_data, self.sample_inputs) if n]

    def sample_feeds(self, directory: str | Path) -> dict[str, torch.Tensor]:
        """The export's sample inputs (the feeds an engine is traced and checked with), refused unless they are the
        spec's inputs, names, shapes and dtypes: a file of another shape, its digest re-recorded, had an engine
        compiled for that shape under this spec's name (or a check end in a traceback)."""
        from safetensors import SafetensorError
        from safetensors.torch import load_file
        path = Path(directory) / self.sample_inputs
        fix = "re-export it with `wan-trt export --overwrite`"
        try:
            feeds = load_file(str(path))
        except (SafetensorError, OSError) as exc:
            raise WanTrtError(f"{path}: not a readable safetensors file ({exc}); {fix}") from None
        if self.sample_inputs in self.verified:  # read by its path after it was verified: held against that file
            require_unchanged(path, self.verified[self.sample_inputs], "export file", "after it was verified",
                              "the inputs read may not be the ones verified; run again")
        try:
            self.spec.check_feeds(feeds)
        except WanTrtError as exc:
            raise WanTrtError(f"{path}: {exc}; {fix}") from None
        return feeds

    def to_dict(self) -> dict[str, Any]:

        return {"format": FORMAT, "spec": self.spec.to_dict(), "fingerprint": self.spec.fingerprint(),
                "ops": self.ops, "opset": self.opset, "weights": self.weights, "graph": self.graph,
                "external_data": self.external_data, "sample_inputs": self.sample_inputs,
                "files": self.files, "op_counts": self.op_counts, "versions": self.versions,
                "export_seconds": self.export_seconds}

    def write(self, directory: Path) -> Path:
        """Hash every file of the export (size + sha256), then write manifest.json last."""

        self.files = {name: file_digest(Path(directory) / name) for name in self.file_names()}
        text = json.dumps(self.to_dict(), indent=2)
        path = Path(directory) / MANIFEST
        path.write_text(text)
        self.sha256 = bytes_digest(text.encode())
        return path

    def made_from(self, checkpoint: str | Path) -> bool:
        """Whether the file ``checkpoint`` holds the bytes this export's weights were read from (their recorded
        sha256)."""
        return self.weights["source"] == "checkpoint" and \
            file_digest(checkpoint)["sha256"] == self.weights["file_sha256"]

    def graph_path(self, directory: str | Path) -> Path:
        """The ONNX graph's path; a clear error for an export made without one."""
        if self.graph is None:
            raise WanTrtError(f"{directory} was exported with --no-onnx: it has no ONNX graph (ONNX Runtime and "
                              "TensorRT need one); re-export without --no-onnx")
        return Path(directory) / self.graph

    def verify_files(self, directory: str | Path) -> None:
        """Refuse a graph, external data or sample inputs whose size or sha256 is not the recorded one."""

        for name in self.file_names():
            path = Path(directory) / name
            before = file_identity(path) if path.is_file() else None
            verify_file(path, self.files[name], f"the export is incomplete or damaged; {REMAKE}")
            require_unchanged(path, before, "export file", "while it was verified", "run again")
            self.verified[name] = before
        if self.graph is not None:
            self._verify_external_locations(Path(directory))

    def require_graph_verified(self, directory: str | Path, since: str) -> None:
        """Refuse if the graph or its external data is no longer the file :meth:`verify_files` hashed (replaced or
        rewritten ``since``, e.g. 'while ONNX Runtime loaded it'): what was read may not be what was verified."""
        for name in (n for n in (self.graph, self.external_data) if n):
            if name not in self.verified:  # nothing to hold it against: its digest was never checked
                raise WanTrtError(f"export file {Path(directory) / name} was read by a runtime, but never verified "
                                  f"against the manifest (read with verify=False): read the export with "
                                  f"Manifest.read({str(directory)!r}) before a runtime reads its graph")
            require_unchanged(Path(directory) / name, self.verified[name], "export file", since,
                              "what was read may not be the file verified; run again")

    def _verify_external_locations(self, directory: Path) -> None:
        """The graph's tensors stored outside it (anywhere in it: subgraphs, local functions, sparse and listed
        tensors) must lie in the recorded (hashed) external-data file: the graph names its files itself, and
        weights in any other file would escape the hashes."""
        from wan_trt.export.graph import load_structure, stored_tensors  # deferred: graph.py reads specs
        tensors = stored_tensors(load_structure(directory / self.graph))  # subgraphs and functions included
        used = {e.value for t in tensors for e in t.external_data if e.key == "location"}
        stray = sorted(used - {self.external_data})
        if stray:
            raise WanTrtError(f"{directory / self.graph} reads weights from {', '.join(stray)}, which the manifest "
                              f"does not record ({self.external_data or 'no external data'}); {REMAKE}")

    @staticmethod
    def digest_at(directory: str | Path) -> str | None:
        """The sha256 of the manifest.json now in ``directory`` (what :attr:`sha256` of one read there is), or
        None where none can be read: whether a folder still holds the export read from it."""
        try:
            return bytes_digest((Path(directory) / MANIFEST).read_bytes())
        except OSError:
            return None

    @classmethod
    def read(cls, directory: str | Path, verify: bool = True) -> "Manifest":
        """Load and check a manifest; with ``verify`` every file it names must have its recorded size and hash."""

        directory = Path(directory)
        path = directory / MANIFEST
        if not path.is_file():
            make = "make one with `wan-trt export --config CONFIG --out DIR`"
            if not directory.exists():
                raise WanTrtError(f"{directory} does not exist: expected a `wan-trt export` directory; {make}")
            if not directory.is_dir():
                folder = (f"give its folder {directory.parent}" if directory.name == MANIFEST
                          else "give the export's folder")
                raise WanTrtError(f"{directory} is a file, not an export directory; {folder}")
            raise WanTrtError(f"{directory} holds no {MANIFEST}: not a finished `wan-trt export` directory; {make}")
        raw = path.read_bytes()
        data = parse_manifest(raw, path)
        manifest = cls(**data)
        manifest.sha256 = bytes_digest(raw)
        if verify:
            manifest.verify_files(directory)
        return manifest


def reference_model(manifest: "Manifest", dtype, device):
    """The PyTorch module holding the graph's weights (same seed or checkpoint), in ``dtype`` on ``device``:
    the DiT for a pass, the video decoder for a decoder graph."""
    return _build_reference(manifest, _reference_checkpoint(manifest), dtype, device)


def reference_models(manifest: "Manifest", device) -> tuple[Any, Any]:
    """The graph's PyTorch module in the graph's precision, its weights verified to be the graph's, and in fp32 (the
    same module for an fp32 graph): a check's yardstick and reference. A checkpoint is read and hashed once for
    both."""
    path = _reference_checkpoint(manifest)
    low = _build_reference(manifest, path, manifest.spec.dtype, device)
    verify_weights(manifest, low)
    fp32 = low if manifest.spec.precision == "fp32" else _build_reference(manifest, path, torch.float32, device)
    return low, fp32


def _reference_checkpoint(manifest: "Manifest") -> str | None:
    """The checkpoint the graph's weights were read from (None: seeded), checked to be here and unchanged."""
    w = manifest.weights
    path = w.get("path") if w["source"] == "checkpoint" else None
    if path and not Path(path).is_file():
        raise WanTrtError(f"the graph's checkpoint {path} is not on this machine; the check needs it to "
                          "rebuild the PyTorch reference")
    if path and not manifest.made_from(path):  # the weights in the graph's precision alone miss a rewrite below it
        raise WanTrtError(f"the graph's checkpoint {path} has changed since it was exported (its sha256 is not the "
                          "one recorded): a PyTorch model rebuilt from it is not the graph's; put the exported "
                          "checkpoint back, or re-export")
    return path


def _build_reference(manifest: "Manifest", path: str | None, dtype, device):
    return graph_kind(manifest.spec).build(manifest.spec.config, dtype, device, path, manifest.weights.get("seed", 0))


def verify_weights(manifest: "Manifest", model) -> None:
    """Fail if ``model`` (in the graph's precision) does not hold the weights the graph was exported with."""

    if weights_fingerprint(model) != manifest.weights["sha256"]:
        raise WanTrtError("the rebuilt PyTorch reference does not hold the graph's weights (checkpoint changed "
                          "since export?); re-export")
