"""The runtime file beside an engine (what the C++ runtime reads) is written whole or not at all."""
import errno
import hashlib
from pathlib import Path

import pytest

from wan_trt.config_load import load_config
from wan_trt.digest import file_digest
from wan_trt.decoder_spec import DecoderSpec, TinyDecoderSpec
from wan_trt.engines.runtime.runtime_file import runtime_path, write_runtime_file
from wan_trt.errors import WanTrtError
from wan_trt.export.manifest import Manifest
from wan_trt.spec import PassSpec

WEIGHTS = "5e" * 32  # a weights sha256, as a manifest records it


def _manifest(spec):
    """The manifest of an export of ``spec`` from seeded weights whose sha256 is WEIGHTS (no files of its own)."""
    return Manifest(spec, "native", 23, {"source": "random", "seed": 4, "sha256": WEIGHTS})


def test_a_write_that_fails_leaves_the_earlier_runtime_file_whole(tmp_path, monkeypatch):
    """It was written in place: a full disk left a truncated file, which the C++ runtime then read."""
    manifest = _manifest(PassSpec.from_config(load_config("universal-small"), "fp32"))
    engine = tmp_path / "engine.pt2"
    engine.write_bytes(b"an engine")
    earlier = write_runtime_file(manifest, engine, file_digest(engine), "cpu").read_text()

    def half_then_full(self, data, *args, **kwargs):  # writes half of what it was given, then the disk is full
        with open(self, "wb" if isinstance(data, bytes) else "w") as f:
            f.write(data[:len(data) // 2])
        raise OSError(errno.ENOSPC, "No space left on device")
    monkeypatch.setattr(Path, "write_text", half_then_full)
    monkeypatch.setattr(Path, "write_bytes", half_then_full)
    with pytest.raises((OSError, WanTrtError)):
        write_runtime_file(manifest, engine, file_digest(engine), "cpu")
    assert runtime_path(engine).read_text() == earlier
    assert sorted(p.name for p in tmp_path.iterdir()) == [engine.name, runtime_path(engine).name]  # no staging left


def test_the_runtime_file_ends_with_the_sha256_of_its_other_lines(tmp_path):
    """The C++ runtime refuses a runtime file whose last line is not the sha256 of the bytes before it."""
    manifest = _manifest(PassSpec.from_config(load_config("universal-small"), "fp32"))
    engine = tmp_path / "engine.pt2"
    engine.write_bytes(b"an engine")
    data = write_runtime_file(manifest, engine, file_digest(engine), "cpu").read_bytes()
    body, _, last = data[:-1].rpartition(b"\n")
    assert data.startswith(b"wan_trt_runtime 6\n") and data.endswith(b"\n")
    assert last.decode() == "sha256 " + hashlib.sha256(body + b"\n").hexdigest()


@pytest.mark.parametrize("call", ["first", "steady"])
def test_a_decoder_runtime_file_records_the_weights_of_its_export(tmp_path, call):
    """The C++ runtime pairs a first and a steady decoder engine by their runtime files, which named config and
    precision but not the weights: a pair from two exports of other weights streamed. Each file now records its
    export's weights sha256 (version 4), which Python's pair check compares too."""
    manifest = _manifest(DecoderSpec.from_config(load_config("universal-small"), "fp32", call))
    engine = tmp_path / "engine.pt2"
    engine.write_bytes(b"an engine")
    lines = write_runtime_file(manifest, engine, file_digest(engine), "cpu").read_text().splitlines()
    assert lines[0] == "wan_trt_decoder 6" and f"weights {WEIGHTS}" in lines and f"call {call}" in lines


@pytest.mark.parametrize("kind", [DecoderSpec, TinyDecoderSpec])
def test_a_decoder_runtime_file_records_its_graph_kind(tmp_path, kind):
    """The C++ runtime could not tell the Wan decoder's engines from the tiny decoder's: its messages named the export
    command of both. Each file records its graph kind now (version 6)."""
    manifest = _manifest(kind.from_config(load_config("universal-small"), "fp32", "steady"))
    engine = tmp_path / "engine.pt2"
    engine.write_bytes(b"an engine")
    lines = write_runtime_file(manifest, engine, file_digest(engine), "cpu").read_text().splitlines()
    assert lines[0] == "wan_trt_decoder 6" and f"graph {kind.KIND}" in lines


@pytest.mark.parametrize("graph", ["pass", "decoder"])
@pytest.mark.parametrize("device, kind", [("cpu", "cpu"), ("cuda", "cuda"), ("cuda:1", "cuda")])
def test_a_runtime_file_records_the_kind_of_device_its_engine_was_built_for(tmp_path, graph, device, kind):
    """The C++ runtime could not refuse a CUDA package run with --device cpu (or a CPU one with --device cuda), as
    Python's EngineMetadata.check_runs_on does: the file named no device. It records the engine's kind of device
    now (DiT version 6, decoder 5)."""
    cfg = load_config("universal-small")
    spec = PassSpec.from_config(cfg, "fp32") if graph == "pass" else DecoderSpec.from_config(cfg, "fp32", "steady")
    engine = tmp_path / "engine.pt2"
    engine.write_bytes(b"an engine")
    lines = write_runtime_file(_manifest(spec), engine, file_digest(engine), device).read_text().splitlines()
    assert lines[0] == ("wan_trt_runtime 6" if graph == "pass" else "wan_trt_decoder 6")
    assert [line for line in lines if line.startswith("device")] == [f"device {kind}"]
