"""Size + sha256 of the files wan-trt writes, recorded when written and checked before use.

An export's manifest records ``{name: {"size": bytes, "sha256": hex}}`` for its graph,
external data and sample inputs; an engine's metadata records its engine file the same
way. A truncated, corrupted or swapped file is then refused with its name and the step
that remakes it, before any parser sees it.
"""
from __future__ import annotations

import hashlib
import os
from pathlib import Path
from typing import Any

from wan_trt.errors import WanTrtError

CHUNK = 16 * 2 ** 20  # bytes read at a time: graphs with external data reach several GB
_verified: dict[tuple, str] = {}  # (path, size, mtime_ns, ctime_ns, inode) -> sha256, so one process hashes a file once


def file_digest(path: str | Path) -> dict[str, Any]:
    """``{"size": bytes, "sha256": hex}`` of ``path``, streamed in chunks."""
    path = Path(path)
    stat = path.stat()
    key = (str(path.resolve()), stat.st_size, stat.st_mtime_ns, stat.st_ctime_ns, stat.st_ino)
    if key not in _verified:
        digest = hashlib.sha256()
        with open(path, "rb") as f:
            while chunk := f.read(CHUNK):
                digest.update(chunk)
        _verified[key] = digest.hexdigest()
    return {"size": stat.st_size, "sha256": _verified[key]}


def bytes_digest(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def check_digest_record(record: Any, where: str) -> None:
    """Refuse a recorded digest that is not ``{"size": int >= 0, "sha256": 64 hex chars}``."""
    ok = (isinstance(record, dict) and set(record) == {"size", "sha256"} and type(record["size"]) is int
          and record["size"] >= 0 and isinstance(record["sha256"], str) and len(record["sha256"]) == 64
          and all(c in "0123456789abcdef" for c in record["sha256"]))
    if not ok:
        raise WanTrtError(f"{where}: expected {{'size': bytes, 'sha256': 64 hex digits}}, got {record!r}")


def file_identity(path: str | Path) -> tuple[int, int, int, int, int]:
    """(device, inode, size, modification and change times in ns) of ``path``: changes when the file is replaced (a
    build renames a new one over it) or rewritten in place, also by a writer that sets the modification time back
    (cp -p, rsync -t: only the change time, which no one can set, tells)."""
    st = os.stat(path)
    return st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns


def require_unchanged(path: str | Path, identity: tuple, what: str, since: str, why: str) -> None:
    """Refuse ``path`` (named ``what``: a flag, or a kind of file) if it is no longer the file whose
    :func:`file_identity` was ``identity``, taken ``since`` ('while the export read it'); ``why`` says what that would
    cost and what to do."""
    now = file_identity(path)
    if now == identity:
        return
    if now[:4] == tuple(identity[:4]):  # the same file, size and modification time: only its change time moved
        raise WanTrtError(f"{what} {path} changed {since}: its status changed (a chmod, chown, new hard link or a write "
                          f"that set its modification time back: only its change time tells), so it cannot be taken "
                          f"for the file verified without reading it again; {why}")
    raise WanTrtError(f"{what} {path} was replaced or rewritten {since}: {why}")


def verify_file(path: str | Path, record: dict[str, Any], remake: str) -> None:
    """Refuse ``path`` unless its size and sha256 are the recorded ones; ``remake`` says how to fix it."""
    path = Path(path)
    if not path.is_file():
        raise WanTrtError(f"{path} is missing; {remake}")
    size = os.path.getsize(path)
    if size != record["size"]:
        raise WanTrtError(f"{path} is {size} bytes, {record['size']} were written (truncated or replaced); {remake}")
    if file_digest(path)["sha256"] != record["sha256"]:
        raise WanTrtError(f"{path} has changed since it was written (sha256 differs from the recorded one); {remake}")
