"""Engine metadata: what an engine was built from, so a stale or foreign engine is never reused.

Every engine file ``E`` has ``E.json`` beside it. Its ``key`` hashes the spec (config,
precision, I/O), the weights, the backend, the device and the tool versions; loading
an engine against a manifest whose key differs is an error, and a build whose key
matches an existing engine reuses it.
"""
from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from wan_trt.errors import WanTrtError
from wan_trt.export.manifest import Manifest, tool_versions


def engine_key(manifest: Manifest, backend: str, device: str, extra: dict[str, Any] | None = None) -> str:
    """Content hash of everything that makes an engine what it is."""
    versions = {k: v for k, v in tool_versions().items() if k != "wan_trt"}
    payload = {"spec": manifest.spec.fingerprint(), "weights": manifest.weights["sha256"], "backend": backend,
               "device": device, "ops": manifest.ops, "versions": versions, "extra": extra or {}}
    return hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()[:20]


@dataclass
class EngineMetadata:
    backend: str  # "aoti" | "tensorrt"
    device: str
    key: str
    spec_fingerprint: str
    config: str
    precision: str
    ops: str
    weights_sha256: str
    export_dir: str
    build_seconds: float | None = None
    versions: dict[str, str] = field(default_factory=tool_versions)
    extra: dict[str, Any] = field(default_factory=dict)

    @staticmethod
    def path_for(engine: Path) -> Path:
        return engine.with_name(engine.name + ".json")

    def write(self, engine: Path) -> None:
        self.path_for(engine).write_text(json.dumps(asdict(self), indent=2))

    @classmethod
    def read(cls, engine: str | Path) -> "EngineMetadata":
        engine = Path(engine)
        meta = cls.path_for(engine)
        if not engine.is_file():
            raise WanTrtError(f"engine {engine} does not exist; build it with `wan-trt build`")
        if not meta.is_file():
            raise WanTrtError(f"engine {engine} has no {meta.name}: it was not built by `wan-trt build`; rebuild it")
        return cls(**json.loads(meta.read_text()))

    def check_against(self, manifest: Manifest, engine: Path) -> None:
        """Refuse an engine built for another config, precision, I/O or weights than ``manifest``."""
        spec = manifest.spec
        problems = []
        if self.config != spec.config.name:
            problems.append(f"config {self.config!r}, manifest {spec.config.name!r}")
        if self.precision != spec.precision:
            problems.append(f"precision {self.precision}, manifest {spec.precision}")
        if self.spec_fingerprint != spec.fingerprint():
            problems.append("I/O spec differs")
        if self.weights_sha256 != manifest.weights["sha256"]:
            problems.append("weights differ")
        if problems:
            raise WanTrtError(f"engine {engine} was built for another export ({'; '.join(problems)}); "
                              "rebuild it with `wan-trt build` on this export")
