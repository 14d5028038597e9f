"""Engine metadata: what an engine was built from, so a stale, foreign or damaged engine is never reused.

Every engine file ``E`` has ``E.json`` beside it. Its ``key`` hashes the spec (config,
precision, I/O), the weights, the backend, the device, the tool versions and wan-trt's own code
that decides what the graph computes and how (:func:`graph_code_digest`); it also
records the engine file's size and sha256 and the sha256 of the export's manifest.json.
Loading an engine whose file or export differs from the recorded ones is an error, and a
build reuses an existing engine only when all of them match.
"""
from __future__ import annotations

import contextlib
import functools
import hashlib
import importlib.util
import json
import os
import re
import tempfile
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any, Iterator

from wan_trt.digest import check_digest_record, file_digest, require_unchanged, verify_file
from wan_trt.engines.backends import get_backend
from wan_trt.engines.runtime.runner import concrete_device
from wan_trt.errors import WanTrtError
from wan_trt.export.decoder import decoder_dirs
from wan_trt.export.manifest import MANIFEST, Manifest, tool_versions
from wan_trt.export.manifest_schema import OPS
from wan_trt.log import logger
from wan_trt.model.fp8 import FP8_SCHEME
from wan_trt.outputs import (check_parent_chain, engine_name_room, engine_of_metadata, remove_stale_partials, resolved,
                             usual_file_mode, write_file, written_by_build)
from wan_trt.owned import recorded_files

REBUILD = "rebuild it with `wan-trt build`"
DEVICE = re.compile(r"cpu|cuda(:[0-9]+)?")  # the devices an engine is built for
_NONE = type(None)


def default_engine_path(directory: Path, backend: str, device: str, ops: str = "native") -> Path:
    """Where `wan-trt build --backend BACKEND` writes an engine without --out: beside the export, named by the
    backend's registered suffix (``engine_aoti_plugins_cuda.pt2``: backend aoti, ops plugins, device cuda)."""
    flavour = "" if ops == "native" else f"_{ops}"
    return directory / f"engine_{backend}{flavour}_{device}{get_backend(backend).engine_suffix}"


# The packages and modules whose code decides an engine's graph beyond its export's manifest: the model,
# the graph kinds (their ``prepare``), the fused ops, the exporters and the engine backends.
GRAPH_CODE = ("wan_trt.model", "wan_trt.graphs", "wan_trt.plugins", "wan_trt.export", "wan_trt.engines.backends")


@functools.lru_cache(maxsize=None)
def graph_code_digest(modules: tuple[str, ...] = GRAPH_CODE) -> str:
    """sha256 of the source files of ``modules`` (a package: its own ``*.py`` files), so that an engine built
    by other wan-trt code, in which the same export may make another graph, is rebuilt, not reused."""
    digest = hashlib.sha256()
    for name in modules:
        spec = importlib.util.find_spec(name)
        if spec is None or spec.origin is None:
            raise WanTrtError(f"engine key: cannot find the source of {name}")
        origin = Path(spec.origin)
        files = sorted(origin.parent.glob("*.py")) if spec.submodule_search_locations else [origin]
        for path in files:
            digest.update(f"{name}:{path.name}:".encode())
            digest.update(path.read_bytes())
    return digest.hexdigest()[:20]


def key_tools(versions: dict[str, str]) -> dict[str, str]:
    """The tools' ``versions`` that make an engine what it is: all but wan-trt's own (its graph code is hashed apart,
    :func:`graph_code_digest`), so an engine a later wan-trt reuses keeps the version that built it."""
    return {k: v for k, v in versions.items() if k != "wan_trt"}


def engine_key(manifest: Manifest, backend: str, device: str, extra: dict[str, Any] | None = None) -> str:
    """Content hash of everything that makes an engine what it is."""
    versions = key_tools(tool_versions())
    payload = {"spec": manifest.spec.fingerprint(), "weights": manifest.weights["sha256"], "backend": backend,
               "device": device, "ops": manifest.ops, "versions": versions, "code": graph_code_digest(),
               "extra": extra or {}}
    if manifest.spec.precision == "fp8":  # which GEMMs and how: not in the weights' hash (taken before quantizing)
        payload["fp8"] = FP8_SCHEME
    return hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()[:20]


@dataclass(kw_only=True)
class EngineMetadata:
    """What an engine was built from (``E.json`` beside engine ``E``); fields by keyword only."""

    backend: str  # "aoti" | "tensorrt"
    device: str
    key: str
    spec_fingerprint: str
    config: str
    precision: str
    ops: str
    weights_sha256: str
    export_dir: str
    manifest_sha256: str = ""  # of the export's manifest.json
    engine_file: dict[str, Any] = field(default_factory=dict)  # {size, sha256} of the engine, set by install_engine
    build_seconds: float | None = None
    versions: dict[str, str] = field(default_factory=tool_versions)
    extra: dict[str, Any] = field(default_factory=dict)

    TYPES = {"build_seconds": (float, int, _NONE), "engine_file": (dict,), "versions": (dict,), "extra": (dict,)}

    @classmethod
    def of_build(cls, manifest: Manifest, directory: Path, *, backend: str, device: str, key: str, ops: str,
                 build_seconds: float | None = None, extra: dict[str, Any] | None = None) -> "EngineMetadata":
        """The metadata of an engine built now from the export ``manifest`` in ``directory``."""
        spec = manifest.spec
        return cls(backend=backend, device=device, key=key, spec_fingerprint=spec.fingerprint(),
                   config=spec.config.name, precision=spec.precision, ops=ops,
                   weights_sha256=manifest.weights["sha256"], export_dir=str(Path(directory).resolve()),
                   manifest_sha256=manifest.sha256, build_seconds=build_seconds, extra=extra or {})

    @property
    def backend_name(self) -> str:
        """The registry backend that runs this engine (without CUDA graphs), also its engine key:
        'tensorrt', 'aoti', or 'aoti-<ops>' for a package built with fused ops."""
        return self.backend if self.backend != "aoti" or self.ops == "native" else f"aoti-{self.ops}"

    def check_runs_as(self, backend: str, engine: Path, flag: str, remedy: str) -> None:
        """Refuse running ``engine`` (given as ``flag``) as registry backend ``backend`` when it was built for
        another: its runner would run it as built, under the other's name. ``remedy`` says what to do instead."""
        if self.backend_name != backend:
            raise WanTrtError(f"{flag} {engine}: built as {self.backend_name}, not {backend}; {remedy}")

    def check_runs_on(self, device: str, engine: Path, flag: str) -> None:
        """Refuse running ``engine`` (given as ``flag``) on ``device`` when it was built for another device (a GPU
        named without an index is the current one): its runner would run it where it was built, under the other
        device's name."""
        if concrete_device(self.device) != concrete_device(device):
            raise WanTrtError(f"{flag} {engine}: built for {self.device} ({concrete_device(self.device)}), but this "
                              f"run is on --device {device} ({concrete_device(device)}); run it with --device "
                              f"{self.device}, or build one for {device}")

    @staticmethod
    def path_for(engine: Path) -> Path:
        return engine.with_name(engine.name + ".json")

    @classmethod
    def read(cls, engine: str | Path) -> "EngineMetadata":
        """The metadata of ``engine``; refused when the engine or its metadata is missing or malformed."""
        engine = Path(engine)
        meta = cls.path_for(engine)
        if not engine.is_file():
            raise WanTrtError(f"engine {engine} does not exist; build it with `wan-trt build`")
        if not meta.is_file():
            raise WanTrtError(cls.not_an_engine(engine))
        return cls.parse(meta)

    @classmethod
    def not_an_engine(cls, engine: Path) -> str:
        """Why ``engine``, a file without metadata beside it, is refused, and what to give instead: an engine's own
        metadata file or a file of an export was told to be rebuilt, which no build does."""
        built = engine_of_metadata(engine)
        if built is not None and built.is_file():
            return f"{engine} is the metadata of the engine {built}, not an engine: give {built}"
        names = recorded_files(engine.parent / MANIFEST)
        if names is not None and engine.name in (MANIFEST, *names):
            export = engine.parent.parent if decoder_dirs(engine.parent.parent) is not None else engine.parent
            return (f"{engine} is a file of the export {export}, not an engine: give an engine `wan-trt build "
                    f"{export}` made from it")
        return (f"engine {engine} has no {cls.path_for(engine).name} beside it: it was not built by `wan-trt build`; "
                "give an engine file `wan-trt build` wrote (its .json lies beside it), or build one with "
                "`wan-trt build EXPORT_DIR`")

    @classmethod
    def parse(cls, meta: Path) -> "EngineMetadata":
        """Strict read of ``meta``: a JSON object with exactly the fields of this class, typed."""
        try:
            data = json.loads(meta.read_bytes().decode("utf-8"))
        except (UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise WanTrtError(f"{meta} is not valid JSON ({exc}); {REBUILD} --force") from None
        if not isinstance(data, dict):
            raise WanTrtError(f"{meta} should hold a JSON object, got {type(data).__name__}; {REBUILD} --force")
        names = [f.name for f in fields(cls)]
        missing, extra = [n for n in names if n not in data], [n for n in data if n not in names]
        if missing or extra:
            raise WanTrtError(f"{meta}: field(s) {', '.join(map(repr, missing + extra))} "
                              f"{'missing' if missing else 'unexpected'}; {REBUILD} --force")
        for name in names:
            types = cls.TYPES.get(name, (str,))
            if not isinstance(data[name], types) or isinstance(data[name], bool):
                raise WanTrtError(f"{meta}: field {name!r} should be {' or '.join(t.__name__ for t in types)}, got "
                                  f"{type(data[name]).__name__}; {REBUILD} --force")
        check_digest_record(data["engine_file"], f"{meta} (engine_file)")
        from wan_trt.engines.backends import BUILDABLE  # the registry imports nothing heavy
        allowed = {"backend": BUILDABLE, "ops": OPS}
        for name, values in allowed.items():
            if data[name] not in values:
                raise WanTrtError(f"{meta}: field {name!r} is {data[name]!r}, not one of {', '.join(values)} (what "
                                  f"`wan-trt build` writes); {REBUILD} --force")
        if not DEVICE.fullmatch(data["device"]):
            raise WanTrtError(f"{meta}: field 'device' is {data['device']!r}, not a cpu or cuda device; "
                              f"{REBUILD} --force")
        return cls(**data)

    def stale_reason(self, engine: Path, key: str, manifest: Manifest) -> str | None:
        """Why the engine at ``engine`` may not be reused for ``key`` and ``manifest``; None when it may."""
        if self.key != key:
            return (f"it was built with other settings, weights, tool versions or wan-trt code "
                    f"(key {self.key}, now {key})")
        if self.manifest_sha256 != manifest.sha256:
            return "the export's manifest.json changed since it was built (re-exported?)"
        try:
            verify_file(engine, self.engine_file, REBUILD)
        except WanTrtError as exc:
            return f"the engine file is not the one built: {exc}"
        return None

    def check_against(self, manifest: Manifest, engine: Path) -> None:
        """Refuse an engine built for another export than ``manifest``, or whose file changed since its build."""
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
        if self.manifest_sha256 != manifest.sha256:
            problems.append("manifest.json differs from the one it was built from")
        if problems:
            raise WanTrtError(f"engine {engine} was built for another export ({'; '.join(problems)}); "
                              "rebuild it with `wan-trt build` on this export")
        verify_file(engine, self.engine_file, f"{REBUILD} --force")


def check_unchanged(engine: Path, verified: tuple) -> None:
    """Refuse ``engine`` if it is no longer the file whose :func:`~wan_trt.digest.file_identity` was ``verified``
    (taken before its sha256 was checked): a runner would load another file than the one its report names."""
    require_unchanged(engine, verified, "engine", "since it was verified (a build writing it meanwhile?)",
                      "what would run is not the file checked; run again")


def install_engine(partial: Path, engine: Path, meta: EngineMetadata) -> None:
    """Record ``partial``'s size and sha256 in ``meta``, write ``engine``.json, then rename ``partial`` to ``engine``.

    The earlier checks' reports of ``engine`` go first, then the metadata: an interruption in between leaves
    metadata that the old file does not match, so the next build rebuilds instead of reusing it. Refused, with
    nothing installed, when the export it was built from is no longer at its folder (an `export --overwrite` while
    it built).
    """
    check_export_unchanged(meta)
    from wan_trt.validate.check import clear_checks_of  # deferred: the check imports the engines
    clear_checks_of(engine, Path(meta.export_dir))  # they vouch for the file replaced
    meta.engine_file = file_digest(partial)
    write_file(meta.path_for(engine), json.dumps(asdict(meta), indent=2).encode())  # the usual file mode
    if partial.is_file():  # mkstemp's files are private: a serving account could not read the engine
        os.chmod(partial, usual_file_mode())
    os.replace(partial, engine)


def check_export_unchanged(meta: EngineMetadata) -> None:
    """Refuse to install an engine whose export (``meta``'s folder and manifest) was replaced while it was built:
    the engine would stand beside, and be taken for, an export it was not built from."""
    if Manifest.digest_at(meta.export_dir) != meta.manifest_sha256:
        raise WanTrtError(f"{meta.export_dir} was replaced while its engine was built (by an `export --overwrite`?): "
                          "the engine is of the export that was there, so it was not installed; build again")


@contextlib.contextmanager
def staged_file(engine: Path) -> Iterator[Path]:
    """A fresh file next to ``engine`` (same suffix) to build into; removed unless installed. Call it holding
    the engine's lock: the staging files a killed build left are removed first."""
    remove_stale_partials(engine)
    fd, name = tempfile.mkstemp(prefix=f".{engine.name}.partial-", suffix=engine.suffix, dir=engine.parent)
    os.close(fd)
    try:
        yield Path(name)
    finally:
        Path(name).unlink(missing_ok=True)  # a failed or interrupted build leaves nothing half-written


def up_to_date(engine: Path, key: str, manifest: Manifest) -> bool:
    """Whether the engine at ``engine`` can be reused as is; logs why not when one exists."""
    if not engine.is_file():
        return False
    try:
        reason = EngineMetadata.read(engine).stale_reason(engine, key, manifest)
    except WanTrtError as exc:
        reason = str(exc)
    if reason is None:
        logger.info("%s is up to date (key %s, engine file verified)", engine, key)
        return True
    logger.info("rebuilding %s: %s", engine, reason)
    return False


def check_engine_out(engine: Path) -> None:
    """Refuse an engine path that would replace a file `wan-trt build` did not write, or a symbolic link (the engine
    is renamed into place: it would replace the link, not write where it points)."""
    if engine.is_symlink():
        raise WanTrtError(f"--out {engine} is a symbolic link (to {os.path.realpath(engine)}); name the file to write "
                          "itself")
    check_parent_chain(resolved(engine, "--out"), "--out", engine_name_room(engine))
    if engine.is_dir():
        raise WanTrtError(f"--out {engine} is a folder; the engine --out names a file, e.g. {engine}/engine.plan")
    meta = EngineMetadata.path_for(engine)
    present = [p for p in (engine, meta, engine.with_name(engine.name + ".runtime.txt")) if p.exists()]
    if not present:
        return
    if not written_by_build(meta):
        raise WanTrtError(f"--out {engine}: {', '.join(p.name for p in present)} exist(s) and were not written by "
                          f"`wan-trt build` (no valid {meta.name}); pick another --out or move them away yourself")


def export_for_engine(engine: Path, meta: EngineMetadata, verify: bool = True) -> tuple[Path, Manifest]:
    """The export ``engine`` was built from: its recorded ``export_dir``, else the engine's own folder (an export
    moved with its engines), whichever holds the manifest.json with the recorded hash; logged, and with ``verify``
    its files verified."""
    candidates = list(dict.fromkeys([Path(meta.export_dir), engine.resolve().parent]))
    seen = []
    for directory in candidates:
        if not (directory / "manifest.json").is_file():
            seen.append(f"{directory}: no manifest.json")
            continue
        manifest = Manifest.read(directory, verify=False)
        if manifest.sha256 != meta.manifest_sha256:
            seen.append(f"{directory}: another export (manifest sha256 {manifest.sha256[:12]}, engine built from "
                        f"{meta.manifest_sha256[:12]})")
            continue
        if verify:
            manifest.verify_files(directory)
        logger.info("engine %s: checking against its export %s", engine, directory)
        return directory, manifest
    raise WanTrtError(f"engine {engine}: the export it was built from is not found ({'; '.join(seen)}); "
                      f"{REBUILD} on the export to run it with")
