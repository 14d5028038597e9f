"""Strict reading of ``manifest.json``: a JSON object with exactly the expected fields and types.

A manifest with trailing bytes, one that is not JSON, or one with a field missing, extra
or of the wrong type is refused with the file, the field and the fix, before anything
trusts it (file names in it are plain names inside the export directory).
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from wan_trt.digest import check_digest_record
from wan_trt.errors import WanTrtError
from wan_trt.graphs import spec_from_dict
from wan_trt.owned import FORMAT

OPS = ("native", "plugins")
FIX = "re-export it with `wan-trt export --overwrite`"
_NONE = type(None)
# field -> accepted types (bool is refused where int is expected)
FIELDS: dict[str, tuple[type, ...]] = {
    "format": (str,), "spec": (dict,), "fingerprint": (str,), "ops": (str,), "opset": (int,), "weights": (dict,),
    "graph": (str, _NONE), "external_data": (str, _NONE), "sample_inputs": (str,), "files": (dict,),
    "op_counts": (dict,), "versions": (dict,), "export_seconds": (float, int, _NONE)}
WEIGHT_FIELDS = {"source": (str,), "seed": (int,), "sha256": (str,)}
CHECKPOINT_FIELDS = {"path": (str,), "file_sha256": (str,)}


def _typed(value: Any, types: tuple[type, ...]) -> bool:
    return isinstance(value, types) and not (isinstance(value, bool) and bool not in types)


def _check_fields(data: dict, fields: dict[str, tuple[type, ...]], where: str, exact: bool = True) -> None:
    """Refuse a missing, extra or mistyped field of ``data``; ``where`` names the file (and sub-object)."""
    missing = [k for k in fields if k not in data]
    extra = [k for k in data if k not in fields] if exact else []
    if missing or extra:
        raise WanTrtError(f"{where}: field(s) {', '.join(map(repr, missing + extra))} "
                          f"{'missing' if missing else 'unexpected'}; {FIX}")
    for key, types in fields.items():
        if not _typed(data[key], types):
            names = " or ".join("null" if t is _NONE else t.__name__ for t in types)
            raise WanTrtError(f"{where}: field {key!r} should be {names}, got {type(data[key]).__name__} "
                              f"{data[key]!r:.60}; {FIX}")


def _plain_name(name: str | None, path: Path, key: str) -> None:
    if name is not None and (Path(name).name != name or name in ("", ".", "..")):
        raise WanTrtError(f"{path}: field {key!r} is {name!r}, expected a file name inside the export; {FIX}")


def parse_manifest(raw: bytes, path: Path) -> dict[str, Any]:
    """The keyword arguments of :class:`Manifest` from the bytes of ``path``; WanTrtError on any defect."""

    try:
        data = json.loads(raw.decode("utf-8"))  # json.loads refuses trailing bytes ("Extra data")
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise WanTrtError(f"{path} is not valid JSON ({exc}); {FIX}") from None
    if not isinstance(data, dict):
        raise WanTrtError(f"{path} should hold a JSON object, got {type(data).__name__}; {FIX}")
    _check_fields(data, FIELDS, str(path))
    if data["format"] != FORMAT:
        raise WanTrtError(f"{path}: format {data['format']!r}, this wan-trt reads {FORMAT!r}; {FIX}")
    if data["ops"] not in OPS:
        raise WanTrtError(f"{path}: field 'ops' is {data['ops']!r}, expected one of {OPS}; {FIX}")
    weights = data["weights"]
    source = weights.get("source")
    _check_fields(weights, WEIGHT_FIELDS | (CHECKPOINT_FIELDS if source == "checkpoint" else {}),
                  f"{path} (weights)")
    if source not in ("random", "checkpoint"):
        raise WanTrtError(f"{path}: weights source {source!r}, expected 'random' or 'checkpoint'; {FIX}")
    for key in ("graph", "external_data", "sample_inputs"):
        _plain_name(data[key], path, key)
    names = [n for n in (data["graph"], data["external_data"], data["sample_inputs"]) if n]
    if sorted(data["files"]) != sorted(names):
        raise WanTrtError(f"{path}: field 'files' lists {sorted(data['files'])}, the export has {sorted(names)}; "
                          f"{FIX}")
    for name, record in data["files"].items():
        check_digest_record(record, f"{path} (files[{name!r}])")
    try:
        spec = spec_from_dict(data["spec"])
    except WanTrtError as exc:
        raise WanTrtError(f"{path}: {exc}") from None
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        raise WanTrtError(f"{path}: field 'spec' is malformed ({type(exc).__name__}: {exc}); {FIX}") from None
    if spec.fingerprint() != data["fingerprint"]:
        raise WanTrtError(f"{path}: fingerprint {data['fingerprint']!r} is not its spec's ({spec.fingerprint()}); "
                          f"{FIX}")
    kwargs = {k: v for k, v in data.items() if k not in ("format", "fingerprint")}
    return {**kwargs, "spec": spec}
