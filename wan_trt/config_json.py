"""Config JSON to frozen dataclasses: every value checked against its field's type.

The rules live here, once, driven by the dataclass field types (``typing.get_type_hints``):

    bool             a JSON boolean: ``"false"`` or ``0`` is refused, never read as a truth value
    int              a JSON integer (not ``true``, not ``30.0``), at most ``MAX_INT``
    float            a finite JSON number (an integer is accepted as is)
    str              a JSON string
    tuple[int, ...]  a JSON array of integers
    a dataclass      a JSON object, built by the same rules

Required fields are named by the caller (``required(cls, data)``); the others keep the
dataclass default. Unknown keys fail. Every message names the field path and the file.
"""
from __future__ import annotations

import dataclasses
import json
import math
import sys
import typing
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping

from wan_trt.errors import WanTrtError

# No size of a video DiT comes near 2**20 (Matrix-Game: 30 layers, dim 1536); 1e9 is a typo.
MAX_INT = 1 << 20

# Keys of upstream config.json files that carry no information for wan-trt.
IGNORED_KEYS = frozenset({"_class_name", "_diffusers_version", "_name_or_path"})
# Keys of upstream config.json files that select something wan-trt's model does not have: checked (a JSON
# boolean) and only the value the model is refused otherwise, by reason; not kept in the config.
FIXED_KEYS = {"inject_sample_info": (False, "true adds an fps embedding (upstream's sample_fps), which this model "
                                            "and upstream's released checkpoints do not have")}
# Fields earlier wan-trt versions wrote, and why they are gone.
REMOVED_KEYS = {"rope_max_frames": "streams have no RoPE table and no length limit any more; remove the field"}

Required = Callable[[type, Mapping[str, Any]], Iterable[str]]


def field_error(name: str, expected: str, got: Any, where: str) -> WanTrtError:
    """The one message of a bad config value: field path, expectation, value, file and fix."""
    shown = f"{got!r} ({type(got).__name__})" if not isinstance(got, (tuple, list)) else repr(got)
    return WanTrtError(f"config field '{name}': expected {expected}, got {shown} (in {where}); "
                       "fix it in that file or pass a preset to --config")


class _RepeatedKey(Exception):
    pass


def first_repeated_key(pairs: list[tuple[str, Any]], ignored: str | None = None) -> str | None:
    """The first key of a JSON object's ``pairs`` given a second time (json keeps the last value without a word),
    keys starting with ``ignored`` aside; None where every key is given once."""
    seen: set[str] = set()
    for key, _ in pairs:
        if ignored is not None and key.startswith(ignored):
            continue
        if key in seen:
            return key
        seen.add(key)
    return None


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """A JSON object's dict, refusing a key given twice; comments (keys starting with '_') may repeat."""
    repeated = first_repeated_key(pairs, ignored="_")  # '_' keys are comments: read by nothing
    if repeated is not None:
        raise _RepeatedKey(repeated)
    return dict(pairs)


def read_json_object(path: Path) -> dict[str, Any]:
    """The top-level JSON object of ``path``; binary, malformed or non-object files fail."""
    raw = path.read_bytes()
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise WanTrtError(
            f"--config {path}: not a UTF-8 text file (byte 0x{raw[exc.start]:02x} at offset {exc.start}); "
            "expected a JSON config (an upstream config.json or a wan-trt preset file)") from None
    try:
        data = json.loads(text, object_pairs_hook=_unique_keys)
    except (json.JSONDecodeError, RecursionError) as exc:
        raise WanTrtError(f"--config {path}: config file {path} is not valid JSON: {exc}") from None
    except _RepeatedKey as exc:
        raise WanTrtError(f"--config {path}: key {exc.args[0]!r} appears twice in one object; which one the model "
                          "is to have is not clear: keep one") from None
    except ValueError as exc:  # an integer of more digits than Python reads from text
        raise WanTrtError(f"--config {path}: config file {path} holds a number too long to read ({exc})") from None
    if not isinstance(data, dict):
        raise WanTrtError(f"--config {path}: expected a JSON object ({{\"dim\": 1536, ...}}) at the top "
                          f"level, got a JSON {_json_kind(data)}")
    return data


def build(cls: type, data: Any, where: str, path: str, required: Required) -> Any:
    """Dataclass ``cls`` from the JSON object ``data``; ``path`` prefixes field names (``model.``)."""
    if not isinstance(data, Mapping):
        raise field_error(path.rstrip("."), "a JSON object", data, where)
    hints = typing.get_type_hints(cls)
    known = {f.name for f in dataclasses.fields(cls)}
    for name in required(cls, data):
        if name not in data:
            raise WanTrtError(
                f"missing field '{path}{name}' in {where}: an upstream config.json sets it and no default "
                "is assumed; add it to the file or pass a preset to --config")
    kwargs: dict[str, Any] = {}
    for key, value in data.items():
        if key in IGNORED_KEYS or key.startswith("_"):
            continue
        if key in FIXED_KEYS and cls.__name__ == "ModelConfig":
            _check_fixed(key, f"{path}{key}", value, where)
            continue
        if key not in known and key in REMOVED_KEYS:
            raise WanTrtError(f"config field '{path}{key}' (in {where}): {REMOVED_KEYS[key]}")
        if key not in known:
            raise WanTrtError(
                f"config field '{path}{key}' is not a known field (in {where}); "
                f"known fields: {', '.join(sorted(known))}")
        kwargs[key] = _typed(hints[key], value, f"{path}{key}", where, required)
    return cls(**kwargs)


def _check_fixed(key: str, name: str, value: Any, where: str) -> None:
    """``value`` of the FIXED_KEYS entry ``key`` (``name``: its path in the file) is a boolean, and the allowed one."""
    allowed, why = FIXED_KEYS[key]
    if not _is(bool, value):
        raise field_error(name, _NAMES[bool], value, where)
    if value != allowed:
        raise WanTrtError(f"config field '{name}': {str(value).lower()} is not supported: {why} (in {where}); "
                          f"set it to {str(allowed).lower()}")


def _typed(kind: Any, value: Any, name: str, where: str, required: Required) -> Any:
    """``value`` checked against the field type ``kind`` (lists become tuples)."""
    if dataclasses.is_dataclass(kind):
        return build(kind, value, where, name + ".", required)
    if typing.get_origin(kind) is tuple:
        (item,) = {a for a in typing.get_args(kind) if a is not Ellipsis}
        if not isinstance(value, (list, tuple)) or not all(_is(item, v) for v in value):
            raise field_error(name, f"a JSON array of {_PLURALS[item]}", value, where)
        return tuple(_checked_int(v, name, where) if item is int else v for v in value)
    if not _is(kind, value):
        raise field_error(name, _NAMES[kind], value, where)
    return _checked_int(value, name, where) if kind is int else value


_NAMES = {bool: "a JSON boolean (true or false)", int: "an integer", float: "a finite number",
          str: "a string"}
_PLURALS = {bool: "JSON booleans", int: "integers", float: "finite numbers", str: "strings"}


def _is(kind: type, value: Any) -> bool:
    if kind is bool:
        return isinstance(value, bool)
    if kind is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if kind is float:
        if isinstance(value, int) and not isinstance(value, bool):
            return abs(value) <= sys.float_info.max  # an integer past every float (math.isfinite would raise)
        return isinstance(value, float) and math.isfinite(value)
    return isinstance(value, kind)


def _checked_int(value: int, name: str, where: str) -> int:
    if value > MAX_INT:
        raise field_error(name, f"an integer of at most {MAX_INT} (no model comes near)", value, where)
    return value


def _json_kind(value: Any) -> str:
    return {list: "array", str: "string", bool: "boolean", type(None): "null"}.get(type(value), "number")
