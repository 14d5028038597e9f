"""Engine artifacts without compiling: build flags against the export, engine --out safety, metadata files.

Engines compiled for real are covered in test_aoti.py (verified engine file, rebuild of a damaged one,
check against the recorded export); here the engine file is bytes installed by wan-trt's own
``install_engine``, which is all the metadata logic reads.
"""
import json
import logging
import shutil

import pytest
from click.testing import CliRunner

from wan_trt.cli import main
from wan_trt.config_load import load_config
from wan_trt.engines import artifact
from wan_trt.engines.artifact import EngineMetadata, engine_key, install_engine, up_to_date
from wan_trt.engines.backends import get_backend
from wan_trt.errors import WanTrtError
from wan_trt.export.manifest import Manifest
from wan_trt.log import logger
from wan_trt.model import build_model
from wan_trt.model.checkpoint import save_checkpoint

CFG = "universal-small"


def _build(*args):
    return CliRunner().invoke(main, ["build", *args])


def _device(backend, device):
    """``--device DEVICE`` for an AOTInductor build; none for TensorRT, which refuses any but cuda."""
    return ["--device", device] if backend == "aoti" else []


@pytest.mark.parametrize("backend", ["tensorrt", "aoti"])
def test_build_refuses_a_seed_the_export_was_not_made_with(plain_export, backend):
    res = _build(str(plain_export), "--fp32", "--backend", backend, *_device(backend, "cpu"), "--seed", "5")
    assert res.exit_code == 1 and "--seed 5" in res.output and "exported with --seed 2" in res.output, res.output


def test_build_refuses_weights_the_export_was_not_made_from(plain_export, tmp_path):
    ckpt = save_checkpoint(build_model(load_config(CFG)), tmp_path / "other.safetensors")
    res = _build(str(plain_export), "--fp32", "--backend", "tensorrt", "--weights", str(ckpt))
    assert res.exit_code == 1 and "exported with random weights (seed 2)" in res.output, res.output


def test_build_with_config_checks_the_existing_export(plain_export, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    shutil.copytree(plain_export, tmp_path / "out" / f"{CFG}_fp32_native")
    res = _build("--config", CFG, "--fp32", "--backend", "tensorrt", "--seed", "7")
    assert res.exit_code == 1 and "--seed 7" in res.output and "exported with --seed 2" in res.output, res.output


def test_build_with_a_config_edited_since_its_export_refuses_the_old_export(plain_export, tmp_path, monkeypatch):
    """build --config FILE (no DIRECTORY) took out/<name>_<precision>_<ops> whatever config it was made from: after
    the file changed, the engine of the old config was reported up to date (exit 0)."""
    monkeypatch.chdir(tmp_path)
    data = {**load_config(CFG).to_dict(), "name": "mine"}
    (tmp_path / "mine.json").write_text(json.dumps(data))
    from wan_trt.export.transformer import export_transformer
    export_transformer(load_config(tmp_path / "mine.json"), tmp_path / "out" / "mine_fp32_native", "fp32", onnx=False)
    data["model"]["num_layers"] -= 1
    (tmp_path / "mine.json").write_text(json.dumps(data))
    res = _build("--config", "mine.json", "--fp32", "--backend", "aoti", "--device", "cpu")
    assert res.exit_code == 1 and "as it was before (the config differs now)" in res.output, res.output
    assert not list((tmp_path / "out" / "mine_fp32_native").glob("engine*"))


@pytest.mark.parametrize("backend", ["tensorrt", "aoti"])
def test_build_refuses_a_config_the_export_was_not_made_with(plain_export, backend):
    """build DIR --config OTHER built DIR's config and said nothing."""
    res = _build(str(plain_export), "--config", "gta_drive-small", "--fp32", "--backend", backend,
                 *_device(backend, "cpu"))
    assert res.exit_code == 1 and res.output.startswith("error: --config gta_drive-small"), res.output
    assert CFG in res.output and not list(plain_export.glob("engine*"))


@pytest.mark.parametrize("backend", ["tensorrt", "aoti"])
def test_engine_out_never_replaces_a_file_build_did_not_write(plain_export, tmp_path, backend):
    notes = tmp_path / f"notes.{'pt2' if backend == 'aoti' else 'plan'}"  # a name the backend writes engines to
    notes.write_text("mine")
    for target in (notes, plain_export / "manifest.json"):
        before = target.read_bytes()
        res = _build(str(plain_export), "--fp32", "--backend", backend, *_device(backend, "cpu"), "--out", str(target))
        entry = get_backend(backend)
        named = target.suffix == entry.engine_suffix or entry.any_engine_name
        why = "were not written by" if named else f"writes a {entry.engine_suffix} file"
        assert res.exit_code == 1 and why in res.output, res.output
        assert target.read_bytes() == before
    Manifest.read(plain_export)


@pytest.fixture
def installed(plain_export, tmp_path):
    """An engine file installed with its metadata (the bytes stand for a package; nothing here loads it)."""
    manifest = Manifest.read(plain_export)
    key = engine_key(manifest, "aoti", "cpu", {"ops": "native"})
    engine, partial = tmp_path / "engine.pt2", tmp_path / "partial.pt2"
    partial.write_bytes(bytes(range(256)) * 64)
    meta = EngineMetadata.of_build(manifest, plain_export, backend="aoti", device="cpu", key=key, ops="native")
    install_engine(partial, engine, meta)
    return engine, key, manifest


def test_an_engine_of_an_export_replaced_while_it_built_is_not_installed(plain_export, tmp_path):
    """`export --overwrite` while a build compiled (nothing stops it: they share no lock) swapped a new export in,
    and the build installed its engine, of the old export, beside the new one and exited 0. The install is now
    refused, naming why, and nothing is written."""
    from wan_trt.export.transformer import export_transformer
    export = tmp_path / "export"
    shutil.copytree(plain_export, export)
    manifest = Manifest.read(export)
    key = engine_key(manifest, "aoti", "cpu", {"ops": "native"})
    meta = EngineMetadata.of_build(manifest, export, backend="aoti", device="cpu", key=key, ops="native")
    export_transformer(load_config("universal-small"), export, "fp32", seed=3, onnx=False, overwrite=True)
    engine, partial = export / "engine_aoti_cpu.pt2", export / "partial.pt2"
    partial.write_bytes(bytes(range(256)))
    with pytest.raises(WanTrtError, match="was replaced while its engine was built.*not installed; build again"):
        install_engine(partial, engine, meta)
    assert not engine.exists() and not EngineMetadata.path_for(engine).exists()


def test_up_to_date_verifies_the_engine_file(installed, caplog, monkeypatch):
    monkeypatch.setattr(logger, "propagate", True)  # whatever an earlier test's logging set-up left
    caplog.set_level(logging.INFO, logger=logger.name)
    engine, key, manifest = installed
    assert up_to_date(engine, key, manifest)
    data = bytearray(engine.read_bytes())
    data[100:164] = bytes(64)  # same size, other bytes
    engine.write_bytes(bytes(data))
    assert not up_to_date(engine, key, manifest)
    assert "has changed since it was written" in caplog.text
    engine.write_bytes(bytes(data[:1000]))
    with pytest.raises(WanTrtError, match="engine.pt2 is 1000 bytes, 16384 were written"):
        EngineMetadata.read(engine).check_against(manifest, engine)


@pytest.mark.parametrize("edit, expected", [
    (lambda d: d.pop("key"), "field\\(s\\) 'key' missing"),
    (lambda d: d.update(surprise=1), "'surprise' unexpected"),
    (lambda d: d.update(build_seconds="fast"), "field 'build_seconds' should be float or int or NoneType"),
    (lambda d: d.update(engine_file={"size": 1}), "engine_file.*expected"),
])
def test_damaged_engine_metadata_is_refused_by_name(installed, edit, expected):
    engine = installed[0]
    meta = EngineMetadata.path_for(engine)
    data = json.loads(meta.read_text())
    edit(data)
    meta.write_text(json.dumps(data))
    with pytest.raises(WanTrtError, match=f"engine.pt2.json.*{expected}"):
        EngineMetadata.read(engine)
    res = CliRunner().invoke(main, ["check", str(engine), "--blocks", "1"])
    assert res.exit_code == 1 and res.output.startswith("error:") and "engine.pt2.json" in res.output, res.output


def test_engine_key_changes_with_the_code_that_makes_the_graph(tmp_path, monkeypatch, plain_export):
    """An engine built by other wan-trt code (another model or graph form for the same export) is rebuilt."""
    package = tmp_path / "graphcode"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "layers.py").write_text("SCALE = 1\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    before = artifact.graph_code_digest(("graphcode",))
    artifact.graph_code_digest.cache_clear()
    assert artifact.graph_code_digest(("graphcode",)) == before  # same files, same digest
    (package / "layers.py").write_text("SCALE = 2\n")
    artifact.graph_code_digest.cache_clear()
    edited = artifact.graph_code_digest(("graphcode",))
    (package / "fused.py").write_text("")
    artifact.graph_code_digest.cache_clear()
    assert len({before, edited, artifact.graph_code_digest(("graphcode",))}) == 3
    with pytest.raises(WanTrtError, match="cannot find the source of graphcode.absent"):
        artifact.graph_code_digest(("graphcode.absent",))
    artifact.graph_code_digest.cache_clear()

    manifest = Manifest.read(plain_export)
    key = engine_key(manifest, "aoti", "cpu", {"ops": "native"})
    monkeypatch.setattr(artifact, "graph_code_digest", lambda: "other code")
    assert engine_key(manifest, "aoti", "cpu", {"ops": "native"}) != key


def test_a_build_removes_what_a_killed_build_of_its_engine_left(tmp_path):
    from wan_trt.engines.artifact import staged_file
    from wan_trt.outputs import output_lock

    engine = tmp_path / "engine_aoti_cpu.pt2"
    stale = [tmp_path / ".engine_aoti_cpu.pt2.partial-h8ea2z25.pt2", tmp_path / ".engine_aoti_cpu.pt2.json.partial-q1w2e3r4"]
    others = [tmp_path / ".other.pt2.partial-h8ea2z25.pt2", tmp_path / "engine_aoti_cpu.pt2.partial-notes.txt"]
    for path in stale + others:
        path.write_bytes(b"half")
    with output_lock(engine, "build"), staged_file(engine) as partial:
        assert partial.is_file()
    assert not any(p.exists() for p in stale) and all(p.exists() for p in others)


def test_build_takes_the_config_the_export_was_made_with(plain_export):
    from wan_trt.engines.build import check_config_flag

    check_config_flag(plain_export, Manifest.read(plain_export).spec.config, CFG)  # no error


@pytest.mark.parametrize("field, value, expected", [("backend", "torch-eager", "'backend'"),
                                                    ("backend", "onnxruntime", "'backend'"),
                                                    ("device", "xyz", "'device'"),
                                                    ("ops", "turbo", "'ops'")])
def test_engine_metadata_with_values_no_build_writes_is_refused(aoti, tmp_path, field, value, expected):
    """Metadata values were checked for their type only: a backend that builds no engines crashed check and
    inspect with a TypeError or AttributeError, a device 'xyz' with torch's RuntimeError."""
    import json
    import shutil

    from wan_trt.engines.artifact import EngineMetadata
    _, engine = aoti
    copy = tmp_path / engine.name
    shutil.copy(engine, copy)
    meta = json.loads(EngineMetadata.path_for(engine).read_text())
    EngineMetadata.path_for(copy).write_text(json.dumps({**meta, field: value}))
    for command in ("check", "inspect"):
        res = CliRunner().invoke(main, [command, str(copy)])
        assert res.exit_code == 1 and isinstance(res.exception, SystemExit), (command, res.output)
        assert res.output.startswith("error: ") and expected in res.output and "--force" in res.output, res.output


@pytest.mark.parametrize("field, value, expected", [("device", "cuda", "says device cuda, where the package's code "
                                                                       "was compiled for cpu"),
                                                    ("ops", "plugins", "says ops plugins, where the package holds no "
                                                                       "fused kernels")])
def test_engine_metadata_that_says_other_than_its_package_is_refused(aoti, tmp_path, field, value, expected):
    """Metadata edited to values a build writes (device cuda, ops plugins) was taken as it read: inspect reported
    what the package does not hold, a check passed under the name aoti-plugins with a report saying so, a bench row
    was named so, and the C++ runtime file was rewritten with the false device. The package says what it holds:
    its device (AOTInductor's record) and its fused kernels."""
    import json
    import shutil

    from wan_trt.engines.artifact import EngineMetadata
    _, engine = aoti
    copy = tmp_path / engine.name
    shutil.copy(engine, copy)
    meta = json.loads(EngineMetadata.path_for(engine).read_text())
    EngineMetadata.path_for(copy).write_text(json.dumps({**meta, field: value}))
    for command in (["check", str(copy), "--no-stream"], ["inspect", str(copy)]):
        res = CliRunner().invoke(main, command)
        assert res.exit_code == 1 and isinstance(res.exception, SystemExit), (command, res.output)
        assert expected in res.output and "--force" in res.output, res.output


def test_a_damaged_engine_with_its_digest_re_recorded_is_refused_in_a_line(aoti, tmp_path):
    """A package cut short, its metadata's size and sha256 re-recorded, ended in zipfile's BadZipFile (inspect) or
    torch's RuntimeError (check)."""
    import json
    import shutil

    from wan_trt.digest import file_digest
    from wan_trt.engines.artifact import EngineMetadata
    _, engine = aoti
    copy = tmp_path / engine.name
    copy.write_bytes(engine.read_bytes()[:100_000])
    meta = json.loads(EngineMetadata.path_for(engine).read_text())
    EngineMetadata.path_for(copy).write_text(json.dumps({**meta, "engine_file": file_digest(copy)}))
    for command in (["check", str(copy), "--no-stream"], ["inspect", str(copy)]):
        res = CliRunner().invoke(main, command)
        assert res.exit_code == 1 and "not a readable AOTInductor package" in res.output, res.output
        assert "Traceback" not in res.output


def test_a_damaged_graph_with_its_digest_re_recorded_is_refused_in_a_line(exports, tmp_path):
    """An ONNX graph cut short, its manifest's record re-written, ended in protobuf's DecodeError traceback for check,
    build and bench alike (each reads the graph's structure with the manifest)."""
    import json
    import shutil

    from wan_trt.digest import file_digest
    export = tmp_path / "export"
    shutil.copytree(exports["universal-small"], export, ignore=shutil.ignore_patterns("check"))
    graph = export / "model.onnx"
    graph.write_bytes(graph.read_bytes()[:1000])
    data = json.loads((export / "manifest.json").read_text())
    data["files"]["model.onnx"] = file_digest(graph)
    (export / "manifest.json").write_text(json.dumps(data))
    res = CliRunner().invoke(main, ["check", str(export), "--no-stream"])
    assert res.exit_code == 1 and f"{graph}: not a readable ONNX graph" in res.output, res.output
    assert "Traceback" not in res.output


def test_an_installed_engine_and_its_metadata_get_the_usual_file_mode(plain_export, tmp_path):
    """Built through mkstemp's private files, engines and their .json were 0600 (another account, a server's,
    could not read them) where exports and reports get the usual mode."""
    import stat

    from wan_trt.engines.artifact import staged_file
    from wan_trt.outputs import usual_file_mode
    manifest = Manifest.read(plain_export)
    key = engine_key(manifest, "aoti", "cpu", {"ops": "native"})
    meta = EngineMetadata.of_build(manifest, plain_export, backend="aoti", device="cpu", key=key, ops="native")
    engine = tmp_path / "engine.pt2"
    with staged_file(engine) as partial:
        partial.write_bytes(b"package" * 100)
        install_engine(partial, engine, meta)
    modes = {stat.S_IMODE(p.stat().st_mode) for p in (engine, meta.path_for(engine))}
    assert modes == {usual_file_mode()}  # 0644 under the usual umask 022


@pytest.mark.parametrize("flag", [["--timing-cache", "tc.bin"], ["--opt-level", "0"], ["--weak-typing"]])
def test_tensorrt_options_with_another_backend_are_refused(plain_export, flag):
    """--backend aoti dropped them without a word (a timing cache in a folder that does not exist: exit 0)."""
    res = _build(str(plain_export), "--backend", "aoti", "--fp32", "--device", "cpu", *flag)
    assert res.exit_code == 1 and f"{flag[0]}: TensorRT build options; --backend aoti has none" in res.output, \
        res.output


def test_a_cpu_device_with_the_tensorrt_backend_is_refused(plain_export):
    """`build --backend tensorrt --device cpu` dropped --device without a word: a TensorRT plan is always built for
    CUDA (where TensorRT is missing, the missing TensorRT was all it said)."""
    res = _build(str(plain_export), "--backend", "tensorrt", "--fp32", "--device", "cpu")
    assert res.exit_code == 1 and "--device cpu: a TensorRT engine runs on CUDA only" in res.output, res.output
    assert "Traceback" not in res.output


@pytest.mark.parametrize("args, expected", [
    (["--backend", "aoti", "--ops", "plugins", "--device", "cpu"], "--ops plugins"),
    (["--backend", "aoti", "--precision", "fp8", "--device", "cpu"], "FP8 tensor cores"),
    pytest.param(["--backend", "tensorrt"], "TensorRT is not installed",
                 marks=pytest.mark.skipif(__import__("importlib").util.find_spec("tensorrt") is not None,
                                          reason="TensorRT is installed here")),
])
def test_build_with_a_config_refuses_what_it_cannot_build_before_exporting(tmp_path, monkeypatch, args, expected):
    """`build --config` exports first (minutes at full size): flags the build then refused on this machine were found
    only after that export, which was left in out/."""
    monkeypatch.chdir(tmp_path)
    res = _build("--config", CFG, *args)
    assert res.exit_code == 1 and expected in res.output, res.output
    assert not (tmp_path / "out").exists()


def test_build_of_an_export_takes_its_precision_when_none_is_given(aoti, decoder_aoti, decoder_export):
    """`wan-trt build DIR` assumed bf16: an fp32 export was refused as "--bf16 was asked" though no precision was
    given. The precision of an existing export's engine is the export's; one given must still be it."""
    export, engine = aoti
    res = CliRunner().invoke(main, ["build", str(export), "--backend", "aoti", "--device", "cpu"])
    assert res.exit_code == 0 and res.output.strip().endswith(str(engine)), res.output
    res = CliRunner().invoke(main, ["build", str(decoder_export), "--backend", "aoti", "--device", "cpu"])
    assert res.exit_code == 0 and res.output.strip().endswith(str(decoder_aoti)), res.output
    res = CliRunner().invoke(main, ["build", str(export), "--backend", "aoti", "--device", "cpu", "--fp16"])
    assert res.exit_code == 1 and "holds a fp32 graph but --fp16 was asked" in res.output, res.output


def test_a_symbolic_link_given_as_the_engine_is_refused_not_replaced(plain_export, tmp_path):
    """`build --out LINK` with a link to a file not there yet replaced the link itself with the engine: the link was
    lost and nothing was written where it pointed. Refused, as bench's --out refuses one."""
    link = tmp_path / "engine.pt2"
    link.symlink_to(tmp_path / "elsewhere.pt2")
    res = _build(str(plain_export), "--backend", "aoti", "--device", "cpu", "--out", str(link))
    assert res.exit_code == 1 and "is a symbolic link" in res.output and "name the file to write itself" in res.output
    assert link.is_symlink() and sorted(p.name for p in tmp_path.iterdir()) == ["engine.pt2"]


def test_the_export_command_advised_remakes_the_export_it_names(tmp_path):
    """A refusal's advised `wan-trt export` named a file's config by its name (`--config myexp`: 'neither a preset nor
    a file') and left out --no-onnx, so following it failed or wrote another kind of export."""
    data = {**load_config(CFG).to_dict(), "name": "myexp"}
    (tmp_path / "myexp.json").write_text(json.dumps(data))
    from wan_trt.export.transformer import export_transformer
    export_transformer(load_config(tmp_path / "myexp.json"), tmp_path / "e", "fp32", seed=2, onnx=False)
    res = _build(str(tmp_path / "e"), "--seed", "3", "--backend", "aoti", "--device", "cpu")
    assert res.exit_code == 1, res.output
    assert "`wan-trt export --config CONFIG_FILE_OF_myexp --precision fp32 --seed 3 --no-onnx --out " in res.output
    assert "--ops" not in res.output, res.output


def test_a_graph_rewritten_after_its_verification_is_refused_once_loaded(exports, tmp_path):
    """The check verified the export's files when it read the manifest, and ONNX Runtime loaded the graph by its path
    later: a graph rewritten in between (here in place, one bias changed) was checked, and its report said ok for a
    graph the next check refused. The runner holds the files it loaded against the ones verified."""
    import shutil

    import onnx

    from wan_trt.engines.backends.onnxruntime import export_runner
    from wan_trt.errors import WanTrtError
    from wan_trt.export.manifest import Manifest
    export = tmp_path / "export"
    shutil.copytree(exports["universal-small"], export, ignore=shutil.ignore_patterns("check"))
    manifest = Manifest.read(export)  # verified
    runner = export_runner(export, manifest, "cpu")
    graph = onnx.load(str(export / "model.onnx"))
    tensor = next(t for t in graph.graph.initializer if t.data_type == onnx.TensorProto.FLOAT and len(t.dims) == 1)
    values = onnx.numpy_helper.to_array(tensor).copy()
    values[0] += 1e-6
    tensor.CopyFrom(onnx.numpy_helper.from_array(values, tensor.name))
    with open(export / "model.onnx", "r+b") as f:  # in place, as cp writes
        f.write(graph.SerializeToString())
        f.truncate()
    with pytest.raises(WanTrtError, match="model.onnx was replaced or rewritten after it was verified"):
        with runner:
            pass


def test_a_file_whose_status_alone_changed_is_refused_as_such(tmp_path):
    """A chmod or a new hard link moves only a file's change time, which the identity holds (cp -p keeps the
    modification time): such a file was refused as 'replaced or rewritten', sending a user looking for a writer that
    never ran. The message now says what is known: its status changed, which a write that set its modification time
    back also does."""
    from wan_trt.digest import file_identity, require_unchanged
    path = tmp_path / "engine.pt2"
    path.write_bytes(b"engine")
    now = file_identity(path)
    identity = (*now[:4], now[4] - 1)  # as taken before a chmod (a kernel with coarse timestamps may not move it here)
    with pytest.raises(WanTrtError, match=r"engine .*engine.pt2 changed since it was verified: its status changed "
                                          r"\(a chmod, chown, new hard link"):
        require_unchanged(path, identity, "engine", "since it was verified", "run again")
    path.write_bytes(b"another engine")
    with pytest.raises(WanTrtError, match="was replaced or rewritten since it was verified: run again"):
        require_unchanged(path, identity, "engine", "since it was verified", "run again")


def test_a_graph_whose_manifest_was_read_unverified_is_refused_by_its_runtime(exports):
    """A runner of an export whose manifest was read without verification (a library caller's Manifest.read(...,
    verify=False)) loaded its graph and held it against nothing: no digest of what ran was ever checked, and no word
    said so. It is refused, naming how to read the export."""
    from wan_trt.engines.backends.onnxruntime import export_runner
    from wan_trt.errors import WanTrtError
    from wan_trt.export.manifest import Manifest
    export = exports["universal-small"]
    runner = export_runner(export, Manifest.read(export, verify=False), "cpu")
    with pytest.raises(WanTrtError, match=r"model.onnx was read by a runtime, but never verified against the manifest "
                                          r"\(read with verify=False\)"):
        with runner:
            pass
    with export_runner(export, Manifest.read(export), "cpu"):  # verified: loads
        pass


def test_sample_inputs_rewritten_after_their_verification_are_refused_when_read(plain_export, tmp_path):
    """The sample inputs (what an engine is compiled and checked with) were verified when the manifest was read and
    loaded by their path later: a file rewritten in between, with values of the same shapes, was taken."""
    import shutil

    from safetensors.torch import load_file, save_file

    from wan_trt.errors import WanTrtError
    from wan_trt.export.manifest import Manifest
    export = tmp_path / "export"
    shutil.copytree(plain_export, export, ignore=shutil.ignore_patterns("check"))
    manifest = Manifest.read(export)  # verified
    manifest.sample_feeds(export)  # as verified: read
    path = export / manifest.sample_inputs
    feeds = load_file(str(path))
    save_file({name: t + 1 if t.is_floating_point() else t for name, t in feeds.items()}, str(path),
              metadata={"rewritten": "yes"})  # of another size too: told apart whatever the clock's resolution
    with pytest.raises(WanTrtError, match="was replaced or rewritten after it was verified: the inputs read may not "
                                          "be the ones verified"):
        manifest.sample_feeds(export)


def test_a_build_rebuilds_an_engine_whose_metadata_says_other_than_its_package(aoti, tmp_path, monkeypatch):
    """An up-to-date engine (key, manifest and file as recorded) whose metadata says what its package does not hold
    (device cuda over a CPU package) is compiled again by `wan-trt build`, not reused: every runner refuses it. The
    compile itself is recorded, not run (the decision to rebuild is what is tested; tests/engines/backends builds)."""
    import json
    import shutil

    from wan_trt.engines.artifact import EngineMetadata
    from wan_trt.engines.backends import aoti as aoti_backend
    export, engine = aoti
    copy = tmp_path / "export"
    shutil.copytree(export, copy, ignore=shutil.ignore_patterns("check"))
    built = copy / engine.name
    compiled = []
    monkeypatch.setattr(aoti_backend, "_compile", lambda *args: compiled.append(args[2]))
    aoti_backend.build_aoti(copy, device="cpu")
    assert compiled == []  # as built: reused
    meta = EngineMetadata.path_for(built)
    meta.write_text(json.dumps({**json.loads(meta.read_text()), "device": "cuda"}))
    aoti_backend.build_aoti(copy, device="cpu")
    assert compiled == [built]
