"""Actions from a JSON-lines file: one line per block, in stream order from the stream's first block (block 0 for
``wan-trt stream``; the C++ ``wan_stream`` reads its first line as the block its inputs start at).

Each line is a JSON object with one key per action input the config has (``mouse``: camera delta,
2 values; ``keyboard``: ``keyboard_dim_in`` values, 1 for a key held and 0 otherwise, as the model was
trained: other values are not refused, only held to the range below), each either one action
held for the whole block or one row per video frame of the block (9 for block 0, 12 after)::

    {"mouse": [0.1, 0.0], "keyboard": [1, 0, 0, 0]}
    {"mouse": [[0.1, 0.0], [0.1, 0.0], ...12 rows], "keyboard": [0, 0, 1, 0]}

Lines end at '\\n' (a '\\r' before it dropped); a line of JSON whitespace only is blank and skipped;
lines past the blocks asked for are not read (nor decoded). Every defect of the lines
read is refused with its line number before any block runs.

A number, integer or not, is read as the double nearest it, and that double must lie within
+-``torch.finfo(dtype).max`` of the stream's dtype (fp16 65504, bf16 3.38953e+38, fp32 3.40282e+38):
``340282346638528859811704183484516925441`` (fp32's max + 1) is read as fp32's max; ``3.4028235e38``, a
double above it, is refused. The C++ reader (engines/cpp/src/actions.cpp) holds numbers to the same rule.
"""
from __future__ import annotations

import json
import math
from pathlib import Path

import torch

from wan_trt.config import WanConfig
from wan_trt.config_json import first_repeated_key
from wan_trt.errors import WanTrtError
from wan_trt.outputs import check_input_file
from wan_trt.stream import first_raw_frame, raw_frames_in_block


def action_dims(cfg: WanConfig) -> dict[str, int]:
    """The config's action inputs and their widths."""
    a = cfg.model.action_config
    dims = {}
    if cfg.has_mouse:
        dims["mouse"] = a.mouse_dim_in
    if cfg.has_keyboard:
        dims["keyboard"] = a.keyboard_dim_in
    return dims


def read_actions(path: str | Path, cfg: WanConfig, blocks: int, dtype: torch.dtype = torch.float32
                 ) -> dict[str, torch.Tensor]:
    """The raw action frames of blocks 0 .. ``blocks - 1`` from ``path``: name -> fp32 [1, N_raw, D]. Every
    value must lie within ``dtype``'s range too (the stream's: fp16 holds up to 65504; the rule above), so that
    no block is refused after the blocks before it ran."""
    path = Path(path)
    limit = torch.finfo(dtype).max
    dims = action_dims(cfg)
    if not dims:  # nothing of the file would reach the model: refused, not reported as the stream's input
        raise WanTrtError(f"--actions {path}: the config {cfg.name} has no action inputs (no mouse, no keyboard); "
                          "drop --actions")
    check_input_file(path, "--actions")
    lines = [(i, line) for i, line in enumerate(_lines(path.read_bytes()), 1) if line.strip(JSON_SPACE)]
    if not lines:
        raise WanTrtError(f"--actions {path}: no block lines (an empty or blank file); write one line per block")
    if len(lines) < blocks:
        raise WanTrtError(f"--actions {path}: {len(lines)} block line(s), {blocks} block(s) asked; add lines or pass "
                          f"--blocks {len(lines)}")
    frames: dict[str, list[torch.Tensor]] = {name: [] for name in dims}
    for block, (number, raw) in enumerate(lines[:blocks]):
        where = f"--actions {path}, line {number} (block {block})"
        try:
            line = raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise WanTrtError(f"{where}: not UTF-8 text (byte {exc.start} of the line); expected JSON") from None
        try:
            entry = json.loads(line, parse_int=float, parse_constant=_not_json, object_pairs_hook=_Object.of)
        except json.JSONDecodeError as exc:
            if line.startswith("\ufeff"):  # Python's message would advise its own 'utf-8-sig' decoding
                raise WanTrtError(f"{where}: not JSON (it begins with a UTF-8 byte-order mark, which some editors "
                                  "write); save the file as UTF-8 without one") from None
            raise WanTrtError(f"{where}: not JSON ({exc.msg})") from None
        except RecursionError:
            raise WanTrtError(f"{where}: not JSON (nested too deeply)") from None
        if isinstance(entry, _Object) and entry.repeated is not None:
            raise WanTrtError(f"{where}: key {entry.repeated!r} given twice; give each action once")
        if not isinstance(entry, dict) or set(entry) != set(dims):
            got = sorted(entry) if isinstance(entry, dict) else type(entry).__name__
            raise WanTrtError(f"{where}: expected an object with keys {sorted(dims)} ({cfg.name}), got {got}")
        n = raw_frames_in_block(cfg, block)
        for name, dim in dims.items():
            frames[name].append(_rows(entry[name], n, dim, f"{where}, {name}", limit))
    return {name: torch.cat(rows)[None] for name, rows in frames.items()}


JSON_SPACE = b" \t\r\n"  # JSON's whitespace: a line holding nothing else is blank


def _lines(data: bytes) -> list[bytes]:
    """The file's lines as JSON lines has them: ended by '\\n' only, a '\\r' before it dropped (the C++ reader
    splits the same way; str.splitlines would also split at '\\r', form feeds and Unicode separators)."""
    lines = data.split(b"\n")
    return [line[:-1] if line.endswith(b"\r") else line for line in lines]


class _Object(dict):
    """A JSON object as read, with its first repeated key (JSON's objects may repeat one; Python's reader
    keeps the last value, which would take one of two actions without a word)."""

    repeated: str | None = None

    @classmethod
    def of(cls, pairs: list[tuple[str, object]]) -> "_Object":
        obj = cls(pairs)
        obj.repeated = first_repeated_key(pairs)
        return obj


def _not_json(constant: str):
    """NaN and +-Infinity are no JSON numbers (Python's json reads them)."""
    raise json.JSONDecodeError(f"{constant} is not a JSON value", constant, 0)


def _rows(value, n: int, dim: int, where: str, limit: float) -> torch.Tensor:
    """One held action (``dim`` numbers) or ``n`` rows of ``dim`` numbers, as fp32 [n, dim]; |values| <= limit."""
    held = isinstance(value, list) and len(value) == dim and all(_number(v, limit) for v in value)
    rows = isinstance(value, list) and len(value) == n and all(
        isinstance(r, list) and len(r) == dim and all(_number(v, limit) for v in r) for r in value)
    if not (held or rows):
        raise WanTrtError(f"{where}: expected {dim} finite numbers (held for the block) or {n} rows of {dim} "
                          f"(one per video frame), each within +-{limit:.6g} (the stream's precision)")
    t = torch.tensor(value, dtype=torch.float32)
    return t.expand(n, dim).clone() if held else t


def _number(v, limit: float) -> bool:
    """A JSON number (read as the double nearest it: integers too, by ``parse_int=float``) within +-``limit``."""
    return isinstance(v, float) and math.isfinite(v) and abs(v) <= limit


def action_magnitudes(actions: dict[str, torch.Tensor], cfg: WanConfig, block: int) -> str:
    """What ``block``'s actions reach beside the blocks' before it (which ran), for the error of a block that came
    out non-finite: an action far beyond the others (a camera delta of 1e30) is the likely cause. A value the
    stream's dtype holds is not refused up front: how large an action the model's arithmetic survives depends
    on its weights, not on the file."""
    start = first_raw_frame(cfg, block)
    end = start + raw_frames_in_block(cfg, block)
    parts = []
    for name, frames in actions.items():
        here = float(frames[0, start:end].abs().max())
        before = f"{float(frames[0, :start].abs().max()):.3g}" if start else "none ran"
        parts.append(f"{name} up to {here:.3g} in magnitude (the blocks before: {before})")
    return f"block {block}'s actions: " + "; ".join(parts)
