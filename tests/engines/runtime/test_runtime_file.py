"""The runtime file beside an engine (what the C++ runtime reads) is written whole or not at all."""
import errno
import hashlib
from pathlib import Path

import pytest

from wan_trt.config_load import load_config
from wan_trt.digest import file_digest
from wan_trt.engines.runtime.runtime_file import runtime_path, write_runtime_file
from wan_trt.errors import WanTrtError
from wan_trt.spec import PassSpec


def test_a_write_that_fails_leaves_the_earlier_runtime_file_whole(tmp_path, monkeypatch):
    """It was written in place: a full disk left a truncated file, which the C++ runtime then read."""
    spec = PassSpec.from_config(load_config("universal-small"), "fp32")
    engine = tmp_path / "engine.pt2"
    engine.write_bytes(b"an engine")
    earlier = write_runtime_file(spec, engine, file_digest(engine)).read_text()

    def half_then_full(self, data, *args, **kwargs):  # writes half of what it was given, then the disk is full
        with open(self, "wb" if isinstance(data, bytes) else "w") as f:
            f.write(data[:len(data) // 2])
        raise OSError(errno.ENOSPC, "No space left on device")
    monkeypatch.setattr(Path, "write_text", half_then_full)
    monkeypatch.setattr(Path, "write_bytes", half_then_full)
    with pytest.raises((OSError, WanTrtError)):
        write_runtime_file(spec, engine, file_digest(engine))
    assert runtime_path(engine).read_text() == earlier
    assert sorted(p.name for p in tmp_path.iterdir()) == [engine.name, runtime_path(engine).name]  # no staging left


def test_the_runtime_file_ends_with_the_sha256_of_its_other_lines(tmp_path):
    """The C++ runtime refuses a runtime file whose last line is not the sha256 of the bytes before it."""
    spec = PassSpec.from_config(load_config("universal-small"), "fp32")
    engine = tmp_path / "engine.pt2"
    engine.write_bytes(b"an engine")
    data = write_runtime_file(spec, engine, file_digest(engine)).read_bytes()
    body, _, last = data[:-1].rpartition(b"\n")
    assert data.startswith(b"wan_trt_runtime 5\n") and data.endswith(b"\n")
    assert last.decode() == "sha256 " + hashlib.sha256(body + b"\n").hexdigest()
