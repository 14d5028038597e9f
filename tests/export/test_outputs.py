"""Export outputs: --overwrite replaces only wan-trt exports, staging and locking, failed writes, manifests."""
import json
import os
import re
import resource
import shutil
import signal
import subprocess
import sys
import time

import pytest
import torch
from click.testing import CliRunner

from wan_trt.cli import main
from wan_trt.config_load import load_config
from wan_trt.errors import WanTrtError
from wan_trt.export.manifest import Manifest
from wan_trt.export.transformer import export_transformer
from wan_trt.model import build_model
from wan_trt.model.checkpoint import save_checkpoint
from wan_trt.outputs import MARKER, OUTPUT_KINDS, marked_kind, marker_text, staged_dir

CFG = "universal-small"


def _export(out, **kwargs):
    return export_transformer(load_config(CFG), out, "fp32", seed=2, onnx=False, **kwargs)


def _tree(path):
    return sorted(str(p.relative_to(path)) for p in path.rglob("*"))


def test_overwrite_refuses_a_folder_of_user_files(tmp_path, plain_export):
    user = tmp_path / "mine"
    user.mkdir()
    (user / "notes.txt").write_text("keep me")
    with pytest.raises(WanTrtError, match=r"not a wan-trt export \(notes.txt\)"):
        _export(user, overwrite=True)
    mixed = tmp_path / "mixed"
    shutil.copytree(plain_export, mixed)
    (mixed / "notes.txt").write_text("keep me too")
    with pytest.raises(WanTrtError, match=r"holds files or folders wan-trt did not write \(notes.txt\)"):
        _export(mixed, overwrite=True)
    assert (user / "notes.txt").read_text() == "keep me" and (mixed / "notes.txt").read_text() == "keep me too"
    assert _tree(mixed) == sorted(_tree(plain_export) + ["notes.txt"])


def test_out_holding_the_checkpoint_is_refused(tmp_path):
    (tmp_path / "proj").mkdir()
    ckpt = save_checkpoint(build_model(load_config(CFG)), tmp_path / "proj" / "model.safetensors")
    with pytest.raises(WanTrtError, match="holds the input file"):
        export_transformer(load_config(CFG), tmp_path / "proj", "fp32", weights=str(ckpt), overwrite=True,
                           onnx=False)
    assert ckpt.is_file()


def test_out_holding_the_current_directory_is_refused(tmp_path, monkeypatch):
    proj = tmp_path / "proj"
    (proj / "src").mkdir(parents=True)
    (proj / "src" / "code.py").write_text("print(1)")
    monkeypatch.chdir(proj / "src")
    for out in ("..", "."):
        res = CliRunner().invoke(main, ["export", "--config", CFG, "--precision", "fp32", "--no-onnx",
                                        "--out", out, "--overwrite"])
        assert res.exit_code == 1 and "is the current directory or holds it" in res.output, res.output
    assert (proj / "src" / "code.py").read_text() == "print(1)"


def test_user_partial_folder_is_kept_and_overwrite_swaps_cleanly(tmp_path, plain_export):
    out = tmp_path / "export"
    user_partial = tmp_path / "export.partial"
    user_partial.mkdir()
    (user_partial / "draft.txt").write_text("mine")
    shutil.copytree(plain_export, out)
    (out / "check").mkdir()
    report = {"command": "wan-trt check", "backend": "onnxruntime-cpu", "precision": "fp32", "ok": True}
    (out / "check" / "report_onnxruntime-cpu.json").write_text(json.dumps(report))  # what `wan-trt check` adds
    (out / "check" / ".report_engine_aoti_cpu.pt2.json.partial-x1y2z3w4").write_text("{")  # a check killed while writing
    (out / "check" / ".report_engine_aoti_cpu.pt2.json.lock").write_text("")  # the lock a killed check held
    manifest = _export(out, overwrite=True)
    assert (user_partial / "draft.txt").read_text() == "mine"
    assert Manifest.read(out).sha256 == manifest.sha256 and not (out / "check").exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["export", "export.partial"]  # no staging, lock, old copy


def test_second_export_to_the_same_out_fails_at_once(tmp_path):
    out = tmp_path / "export"
    first = subprocess.Popen([sys.executable, "-m", "wan_trt.cli", "export", "--config", CFG, "--precision", "fp32",
                              "--no-onnx", "--out", str(out)], stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 120
        while not list(tmp_path.glob(".export.*")) and first.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)  # until the first export holds its lock and staging folder
        assert first.poll() is None, first.stderr.read()
        with pytest.raises(WanTrtError, match="another wan-trt export is writing"):
            _export(out, overwrite=True)
    finally:
        _, err = first.communicate(timeout=120)
    assert first.returncode == 0, err
    Manifest.read(out)  # the first export is complete and intact


def _limit_file_size():
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # writes past the limit fail with EFBIG instead
    resource.setrlimit(resource.RLIMIT_FSIZE, (30_000, 30_000))  # sample inputs are ~60 kB


def test_full_disk_is_one_error_line_and_keeps_the_old_export(tmp_path, plain_export):
    out = tmp_path / "export"
    shutil.copytree(plain_export, out)
    res = subprocess.run([sys.executable, "-m", "wan_trt.cli", "export", "--config", CFG, "--precision", "fp32",
                          "--no-onnx", "--seed", "5", "--out", str(out), "--overwrite"],
                         preexec_fn=_limit_file_size, capture_output=True, text=True, timeout=300)
    assert res.returncode == 1 and "Traceback" not in res.stderr, res.stderr
    errors = [line for line in res.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "File too large" in errors[0] and str(out) in errors[0], res.stderr
    assert Manifest.read(out).weights["seed"] == 2  # the old export, verified by its hashes
    assert sorted(p.name for p in tmp_path.iterdir()) == ["export"]  # no staging folder or lock left


@pytest.mark.parametrize("out, expected", [("afile/sub", "afile is a file, not a folder"),
                                           ("/proc/wan-trt/export", "--out /proc/wan-trt/export")])
def test_unwritable_out_is_one_error_line(tmp_path, monkeypatch, out, expected):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "afile").write_text("x")
    res = CliRunner().invoke(main, ["export", "--config", CFG, "--precision", "fp32", "--no-onnx", "--out", out])
    assert res.exit_code == 1 and isinstance(res.exception, SystemExit), res.exception
    assert res.output.startswith("error:") and expected in res.output, res.output


@pytest.mark.parametrize("damage, expected", [
    (lambda raw: raw + b"\ngarbage", "is not valid JSON"),
    (lambda raw: b"\x00\xff" + raw[:100], "is not valid JSON"),
    (lambda raw: b"[1, 2]", "should hold a JSON object"),
    (lambda raw: raw.replace(b'"opset": 23', b'"opset": "23"'), "field 'opset' should be int"),
    (lambda raw: raw.replace(b'"ops": "native",', b''), "field\\(s\\) 'ops' missing"),
    (lambda raw: raw.replace(b'"ops": "native",', b'"ops": "native", "extra": 1,'), "'extra' unexpected"),
    (lambda raw: raw.replace(b'"sample_inputs": "sample_inputs.safetensors"',
                             b'"sample_inputs": "../sample_inputs.safetensors"'), "a file name inside the export"),
])
def test_damaged_manifest_is_refused_by_name(tmp_path, plain_export, damage, expected):
    bad = tmp_path / "bad"
    shutil.copytree(plain_export, bad)
    (bad / "manifest.json").write_bytes(damage((plain_export / "manifest.json").read_bytes()))
    with pytest.raises(WanTrtError, match=f"manifest.json.*{expected}"):
        Manifest.read(bad)
    res = CliRunner().invoke(main, ["build", str(bad), "--backend", "aoti", "--device", "cpu", "--fp32"])
    assert res.exit_code == 1 and res.output.startswith("error:") and "manifest.json" in res.output, res.output


def test_changed_sample_inputs_are_refused_before_use(tmp_path, plain_export):
    bad = tmp_path / "bad"
    shutil.copytree(plain_export, bad)
    data = bytearray((bad / "sample_inputs.safetensors").read_bytes())
    data[-64:] = bytes(64)  # same size, other contents
    (bad / "sample_inputs.safetensors").write_bytes(bytes(data))
    with pytest.raises(WanTrtError, match="sample_inputs.safetensors has changed since it was written"):
        Manifest.read(bad)
    (bad / "sample_inputs.safetensors").write_bytes(bytes(data[:1000]))
    with pytest.raises(WanTrtError, match="sample_inputs.safetensors is 1000 bytes, .* were written"):
        Manifest.read(bad)


def test_overwrite_waits_for_no_build_writing_into_the_export(tmp_path, plain_export):
    from wan_trt.outputs import output_lock

    out = tmp_path / "export"
    shutil.copytree(plain_export, out)
    with output_lock(out / "engine_aoti_cpu.pt2", "build"):  # what `wan-trt build` holds while it writes
        with pytest.raises(WanTrtError, match="a wan-trt build is writing into it"):
            _export(out, overwrite=True)
    _export(out, overwrite=True)


def test_a_symlinked_out_is_written_where_it_points_and_stays_a_link(tmp_path, plain_export):
    """The link was renamed aside and replaced by a folder: the user's link was gone and the export it
    pointed to emptied."""
    target = tmp_path / "real"
    shutil.copytree(plain_export, target)
    links = tmp_path / "links"
    links.mkdir()
    (links / "cur").symlink_to(target)
    _export(links / "cur", overwrite=True)
    assert (links / "cur").is_symlink() and (links / "cur").resolve() == target.resolve()
    assert _tree(target) == _tree(plain_export) and Manifest.read(target)
    assert sorted(p.name for p in links.iterdir()) == ["cur"]  # nothing moved aside next to the link
    dangling = links / "gone"
    dangling.symlink_to(tmp_path / "missing")
    with pytest.raises(WanTrtError, match="symbolic link to .*missing"):
        _export(dangling, overwrite=True)
    assert dangling.is_symlink() and not (tmp_path / "missing").exists()


@pytest.mark.parametrize("engine", ["engine_aoti_cpu.pt2", "my.pt2"])
def test_what_a_killed_build_left_does_not_block_an_overwrite(tmp_path, plain_export, engine):
    """A build killed mid-write leaves its lock file and its partial engine: nobody holds the lock, so they
    are stale leftovers of wan-trt's own, removed with the export they are in (they blocked it for good).
    my.pt2: a build of `--out E` (a name of the user's) killed before its first engine was installed has no
    metadata beside them to say they were a build's, and `export --overwrite` refused the export for good over
    wan-trt's own files: a lock and a staging file of one engine name, together, are a build's."""
    out = tmp_path / "export"
    shutil.copytree(plain_export, out)
    (out / f".{engine}.lock").write_text("")
    (out / f".{engine}.partial-h8ea2z25.pt2").write_bytes(b"half an engine")
    _export(out, overwrite=True)
    assert _tree(out) == _tree(plain_export)


def test_only_files_shaped_exactly_as_a_builds_own_count_as_its_leftovers(tmp_path, plain_export):
    """A user's dated backup or an empty note whose names merely resemble a build's files are foreign: the
    folder is refused, not emptied of them."""
    for name in (".engine_tensorrt_cuda.plan.partial-20241127.bak", ".notes.lock",
                 ".engine_aoti_cpu.pt2.partial-h8ea2z25.plan", ".my_model.pt2.partial-h8ea2z25.pt2"):
        out = tmp_path / name.strip(".")
        shutil.copytree(plain_export, out)
        (out / name).write_bytes(b"")
        with pytest.raises(WanTrtError, match="holds files or folders wan-trt did not write"):
            _export(out, overwrite=True)
        assert (out / name).is_file()


def test_a_lock_is_held_while_a_build_holds_it_and_probes_do_not_hold_it_for_each_other(tmp_path):
    import fcntl
    import os

    from wan_trt.outputs import lock_held, output_lock

    engine = tmp_path / "engine_aoti_cpu.pt2"
    lock = tmp_path / ".engine_aoti_cpu.pt2.lock"
    lock.write_text("")
    assert not lock_held(lock)
    with output_lock(engine, "build"):
        assert lock_held(lock) and lock_held(lock)
    lock.write_text("")
    fd = os.open(lock, os.O_RDONLY)
    fcntl.flock(fd, fcntl.LOCK_SH)  # another probe, mid-way (an exclusive probe was seen as a holder)
    try:
        assert not lock_held(lock)
    finally:
        os.close(fd)


def test_an_old_export_that_cannot_be_removed_after_the_swap_is_reported_as_kept(tmp_path, plain_export,
                                                                                 monkeypatch, caplog):
    """A file of the old export that could not be deleted after the new one was in place (read-only, immutable)
    failed the export with 'the previous export, if any, is unchanged', while --out held the new export."""
    import pathlib
    out = tmp_path / "export"
    shutil.copytree(plain_export, out)
    real_unlink = pathlib.Path.unlink

    def unlink(path, missing_ok=False):
        if path.name == "sample_inputs.safetensors" and ".old-" in path.parent.name:
            raise PermissionError(1, "Operation not permitted", str(path))
        return real_unlink(path, missing_ok)

    monkeypatch.setattr(pathlib.Path, "unlink", unlink)
    export_transformer(load_config(CFG), out, "fp32", seed=3, onnx=False, overwrite=True)  # no error
    assert Manifest.read(out).weights["seed"] == 3  # the new export is in place
    kept = [p for p in tmp_path.iterdir() if p.name.startswith(".export.old-")]
    assert len(kept) == 1 and any("could not remove" in r.message and str(kept[0]) in r.message for r in caplog.records)


@pytest.fixture(scope="module")
def external_export(tmp_path_factory):
    """An fp32 export whose every weight lies in model.onnx.data (read-only: tests edit a copy)."""
    import wan_trt.export.writer as writer
    out = tmp_path_factory.mktemp("external") / "ext"
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(writer, "PROTOBUF_LIMIT", 0)  # every weight into model.onnx.data
        export_transformer(load_config(CFG), out, "fp32", seed=2)
    assert Manifest.read(out).external_data == "model.onnx.data"
    return out


def test_weights_in_an_external_file_the_manifest_does_not_record_are_refused(tmp_path, external_export):
    """The external-data file is hashed by its recorded name, but the graph names its own files: a graph whose
    tensors point at another, unhashed file (its weights changed) passed verification and the check."""
    from tests.conftest import edited_graph
    out = shutil.copytree(external_export, tmp_path / "ext")

    def read_weights_from_w_bin(model):
        for tensor in model.graph.initializer:
            for entry in tensor.external_data:
                if entry.key == "location":
                    entry.value = "w.bin"

    edited_graph(out, read_weights_from_w_bin)
    (out / "w.bin").write_bytes((out / "model.onnx.data").read_bytes())
    with pytest.raises(WanTrtError, match="w.bin"):
        Manifest.read(out)


def _external_tensor(name: str, location: str):
    """A 1-element fp32 tensor whose data the graph says lies in ``location``."""
    import onnx
    tensor = onnx.TensorProto(name=name, data_type=onnx.TensorProto.FLOAT, dims=[1],
                              data_location=onnx.TensorProto.EXTERNAL)
    for key, value in (("location", location), ("offset", "0"), ("length", "4")):
        tensor.external_data.add(key=key, value=value)
    return tensor


@pytest.mark.parametrize("where", ["subgraph", "function", "sparse", "tensors"])
def test_weights_in_an_unrecorded_file_anywhere_in_the_graph_are_refused(tmp_path, external_export, where):
    """Only the main graph's initializers and single-tensor attributes were looked at: a tensor read from
    another, unhashed file inside a subgraph, a local function, a sparse initializer or a list-of-tensors
    attribute passed verification."""
    import onnx
    from tests.conftest import edited_graph
    out = shutil.copytree(external_export, tmp_path / "ext")

    def read_one_tensor_from_w_bin(model):
        stray = _external_tensor("stray", "w.bin")
        if where == "subgraph":
            branch = onnx.helper.make_graph([onnx.helper.make_node("Constant", [], ["c"], value=stray)], "branch", [],
                                            [onnx.helper.make_tensor_value_info("c", onnx.TensorProto.FLOAT, [1])])
            model.graph.node.append(onnx.helper.make_node("If", ["cond"], ["unused"], then_branch=branch,
                                                          else_branch=branch))
        elif where == "function":
            model.functions.append(onnx.helper.make_function(
                "local", "f", [], ["c"], [onnx.helper.make_node("Constant", [], ["c"], value=stray)],
                [onnx.helper.make_opsetid("", 17)]))
        elif where == "sparse":
            indices = onnx.helper.make_tensor("stray_indices", onnx.TensorProto.INT64, [1], [0])
            model.graph.sparse_initializer.append(onnx.helper.make_sparse_tensor(stray, indices, [4]))
        else:
            model.graph.node.append(onnx.helper.make_node("Identity", ["x"], ["y"]))
            model.graph.node[-1].attribute.append(onnx.helper.make_attribute("weights", [stray]))

    edited_graph(out, read_one_tensor_from_w_bin)
    (out / "w.bin").write_bytes(b"\0" * 4)
    with pytest.raises(WanTrtError, match="w.bin"):
        Manifest.read(out)


def test_leftovers_of_a_killed_run_are_named_by_what_it_was(tmp_path, caplog):
    """Every staged output shares the staging code; its messages said 'export' for a stream's output too, and
    then named a leftover by the run that found it rather than the one that left it."""
    from wan_trt.outputs import marker_text
    out = tmp_path / "run"
    for name, kind in (("killed-stream", "stream output"), ("killed-export", "export")):
        (tmp_path / f".run.partial-{name}").mkdir()
        (tmp_path / f".run.partial-{name}" / MARKER).write_text(marker_text(kind))
    with caplog.at_level("INFO", logger="wan_trt"), \
            staged_dir(out, lambda path: [], overwrite=False, what="stream output") as staging:
        (staging / "report.json").write_text("{}")
    assert (out / "report.json").is_file() and not any(tmp_path.glob(".run.partial-killed*"))
    messages = [r.getMessage() for r in caplog.records]
    for name, kind in (("killed-stream", "stream output"), ("killed-export", "export")):
        assert any(m.endswith(f".run.partial-{name}, left by an interrupted {kind}") for m in messages), messages


@pytest.mark.parametrize("kind", OUTPUT_KINDS)
def test_the_marker_of_every_kind_of_output_reads_back_as_that_kind(tmp_path, caplog, kind):
    """The marker's text was written by one format string and read by two patterns of their own (the kind of an
    output folder; a looser one naming a killed run's leftover): a change to one would have had the others misread
    wan-trt's own folders. One definition now writes and reads it, for every kind of output staged."""
    with staged_dir(tmp_path / "run", lambda path: [], overwrite=False, what=kind) as staging:
        left = shutil.copytree(staging, tmp_path / ".again.partial-killed")  # as a run killed now leaves it
    assert marked_kind(tmp_path / "run") == marked_kind(left) == kind
    with caplog.at_level("INFO", logger="wan_trt"), \
            staged_dir(tmp_path / "again", lambda path: [], overwrite=False, what="export"):
        pass
    assert any(r.getMessage().endswith(f".again.partial-killed, left by an interrupted {kind}") for r in caplog.records)
    (tmp_path / "run" / MARKER).write_text(f"{kind} folder\n")  # not as wan-trt writes it
    assert marked_kind(tmp_path / "run") is None
    (tmp_path / "run" / MARKER).write_text(marker_text(kind) + marker_text(kind))  # two markers' lines: no kind
    assert marked_kind(tmp_path / "run") is None


def test_an_interrupt_between_the_two_renames_puts_the_old_output_back(tmp_path, plain_export, monkeypatch):
    """The old export is renamed aside, then the new one into place: an interrupt (not an OSError) between the
    two left --out missing and the old export hidden in .NAME.old-XXXX, never cleaned up or named."""
    import os

    import wan_trt.outputs as outputs

    out = tmp_path / "ex"
    shutil.copytree(plain_export, out)
    before = _tree(out)
    rename, calls = os.rename, []

    def interrupted(src, dst):
        calls.append(dst)
        if len(calls) == 2:  # the new output into place
            raise KeyboardInterrupt
        return rename(src, dst)

    monkeypatch.setattr(outputs.os, "rename", interrupted)
    with pytest.raises(KeyboardInterrupt):
        _export(out, overwrite=True)
    monkeypatch.setattr(outputs.os, "rename", rename)
    assert _tree(out) == before and not list(tmp_path.glob(".ex.old-*"))


def test_a_user_file_where_the_lock_goes_is_refused_and_kept(tmp_path):
    """The lock file .NAME.lock beside --out was opened with O_CREAT and unlinked afterwards: a user's file of
    that name was deleted."""
    lock = tmp_path / ".ex.lock"
    lock.write_text("my notes")
    with pytest.raises(WanTrtError, match="in the way of wan-trt's lock"):
        _export(tmp_path / "ex")
    assert lock.read_text() == "my notes" and not (tmp_path / "ex").exists()


def test_a_mount_point_as_out_is_refused_before_any_work(tmp_path, plain_export, monkeypatch):
    """An --out that is a mount point (a container's volume) cannot be renamed aside: the export crashed with
    a traceback (EBUSY) after all its work."""
    import os.path

    out = tmp_path / "volume"
    shutil.copytree(plain_export, out)
    mounted = str(out)
    ismount = os.path.ismount
    monkeypatch.setattr(os.path, "ismount", lambda p: str(p) == mounted or ismount(p))
    with pytest.raises(WanTrtError, match="is a mount point.*a folder inside it"):
        _export(out, overwrite=True)


def test_overwrite_refuses_an_export_holding_a_users_empty_folder(tmp_path, plain_export):
    mixed = tmp_path / "mixed"
    shutil.copytree(plain_export, mixed)
    (mixed / "renders" / "later").mkdir(parents=True)  # the user's, empty: the swap would have deleted it
    with pytest.raises(WanTrtError, match=r"holds files or folders wan-trt did not write \(renders/later/\)"):
        _export(mixed, overwrite=True)
    assert (mixed / "renders" / "later").is_dir()
    assert _tree(mixed) == sorted(_tree(plain_export) + ["renders", "renders/later"])


def test_overwrite_takes_the_empty_check_folder_a_stopped_check_leaves(tmp_path, plain_export):
    out = tmp_path / "exp"
    shutil.copytree(plain_export, out)
    for report in (out / "check").glob("*"):
        report.unlink()  # as a check stopped after clearing the earlier report leaves it
    (out / "check").mkdir(exist_ok=True)
    _export(out, overwrite=True)
    assert Manifest.read(out).weights["seed"] == Manifest.read(plain_export).weights["seed"]  # the new export, whole


def test_overwrite_refuses_an_export_holding_a_folder_it_cannot_read(tmp_path, plain_export, monkeypatch):
    mixed = tmp_path / "mixed"
    shutil.copytree(plain_export, mixed)
    (mixed / "locked").mkdir()
    real = os.scandir

    def scandir(path="."):  # as for a folder of mode 000 and a user other than root
        if os.fspath(path).endswith("locked"):
            raise PermissionError(13, "Permission denied", os.fspath(path))
        return real(path)
    monkeypatch.setattr(os, "scandir", scandir)
    with pytest.raises(WanTrtError, match=r"did not write \(locked/\)"):
        _export(mixed, overwrite=True)
    monkeypatch.undo()
    assert (mixed / "locked").is_dir()


def test_a_stream_output_takes_no_empty_check_folder_as_its_own(tmp_path):
    from wan_trt.outputs import foreign_files
    (tmp_path / "check").mkdir()
    assert foreign_files(tmp_path, []) == ["check/"]  # only an export's check/ is wan-trt's


def test_overwrite_and_check_refuse_a_users_file_named_like_a_check_report(tmp_path, plain_export):
    """Any check/report_*.json counted as wan-trt's by its name alone: --overwrite deleted a user's file of that
    name, and a check of that target deleted it as 'the earlier check's file'. Only a report a check wrote
    (a JSON object with a check report's keys) is taken."""
    from wan_trt.validate.check import clear_report
    mixed = tmp_path / "mixed"
    shutil.copytree(plain_export, mixed)
    mine = mixed / "check" / "report_onnxruntime-cpu.json"
    mine.parent.mkdir(exist_ok=True)
    mine.write_text("my summary of the last run")
    with pytest.raises(WanTrtError, match=r"did not write \(check/report_onnxruntime-cpu.json\)"):
        _export(mixed, overwrite=True)
    with pytest.raises(WanTrtError, match="report_onnxruntime-cpu.json.*not a wan-trt check report"):
        clear_report(mine)
    assert mine.read_text() == "my summary of the last run"


def test_overwrite_and_check_take_run_results_and_staging_files_by_content_not_name(tmp_path, plain_export):
    """check/run_results_*.json and check/.report_*.json.partial-* counted as wan-trt's by name: --overwrite
    deleted a user's notes under such names, and a check deleted the RunResults-named one. Only Polygraphy
    RunResults (as a check saves them) and staging files named as a check names them are taken; a real pair
    of them goes with the export."""
    from polygraphy.comparator import RunResults

    from wan_trt.validate.check import clear_report
    mixed = tmp_path / "mixed"
    shutil.copytree(plain_export, mixed)
    check = mixed / "check"
    check.mkdir(exist_ok=True)
    notes = check / "run_results_notes.json"
    notes.write_text('{"my": "notes, not a RunResults"}')
    staging = check / ".report_x.json.partial-mine"
    staging.write_text("user data")
    with pytest.raises(WanTrtError, match=r"did not write \(check/\.report_x\.json\.partial-mine, "
                                          r"check/run_results_notes\.json\)"):
        _export(mixed, overwrite=True)
    with pytest.raises(WanTrtError, match="run_results_notes.json is not a wan-trt check's RunResults"):
        clear_report(notes)
    assert notes.read_text() == '{"my": "notes, not a RunResults"}' and staging.read_text() == "user data"
    notes.unlink()
    staging.unlink()
    RunResults().save(str(check / "run_results_onnxruntime-cpu.json"))  # as a check saves them
    (check / ".report_onnxruntime-cpu.json.partial-k2x_9q0a").write_text("")  # a killed check's staging file
    _export(mixed, overwrite=True)
    assert not check.exists() or not list(check.iterdir())


def test_an_output_of_another_command_is_refused_as_such(tmp_path, plain_export):
    """`export --out S --overwrite` of a stream output S said S held 'files or folders wan-trt did not write
    (latents.pt, report.json)', and `stream --out E --overwrite` of an export listed the export's own files: each
    is wan-trt's own output of another kind, which the other command does not replace."""
    stream = tmp_path / "s"
    res = CliRunner().invoke(main, ["stream", "--config", "universal-small", "--blocks", "1", "--no-video",
                                    "--out", str(stream)])
    assert res.exit_code == 0, res.output
    before = _tree(stream)
    res = CliRunner().invoke(main, ["export", "--config", "universal-small", "--no-onnx", "--out", str(stream),
                                    "--overwrite"])
    assert res.exit_code == 1 and f"--out {stream} holds a wan-trt stream output, which an export does not " \
                                  "replace" in res.output, res.output
    assert "did not write" not in res.output and _tree(stream) == before, res.output
    export = shutil.copytree(plain_export, tmp_path / "e")
    before = _tree(export)
    res = CliRunner().invoke(main, ["stream", "--config", "universal-small", "--blocks", "1", "--no-video",
                                    "--out", str(export), "--overwrite"])
    assert res.exit_code == 1 and f"--out {export} holds a wan-trt export, which a stream output does not " \
                                  "replace" in res.output, res.output
    assert _tree(export) == before


def test_overwrite_refuses_an_export_holding_a_file_named_dot_json(tmp_path, plain_export):
    """A user's file named `.json` in an export folder crashed `export --overwrite` with a ValueError traceback
    (it was read as the metadata of an engine of no name) instead of refusing the folder."""
    out = tmp_path / "e"
    shutil.copytree(plain_export, out)
    (out / ".json").write_text(json.dumps({"backend": "aoti", "key": "k", "spec_fingerprint": "s", "export_dir": "d"}))
    res = CliRunner().invoke(main, ["export", "--config", CFG, "--precision", "fp32", "--no-onnx", "--out", str(out),
                                    "--overwrite"])
    assert res.exit_code == 1 and isinstance(res.exception, SystemExit), res.output
    assert "holds files or folders wan-trt did not write (.json)" in res.output, res.output
    assert (out / ".json").is_file()


def test_a_decoder_export_into_a_stream_output_is_refused(tmp_path):
    """`export --graph decoder --out S` of a stream output S wrote S/first and S/steady into it, after which
    `stream --out S --overwrite` refused S as holding 'files or folders wan-trt did not write'."""
    stream = tmp_path / "s"
    res = CliRunner().invoke(main, ["stream", "--config", CFG, "--blocks", "1", "--no-video", "--out", str(stream)])
    assert res.exit_code == 0, res.output
    before = _tree(stream)
    for overwrite in ([], ["--overwrite"]):
        res = CliRunner().invoke(main, ["export", "--config", CFG, "--precision", "fp32", "--graph", "decoder",
                                        "--no-onnx", "--out", str(stream), *overwrite])
        assert res.exit_code == 1 and f"--out {stream} holds a wan-trt stream output" in res.output, res.output
        assert _tree(stream) == before


def test_a_run_that_fails_under_a_locked_out_file_leaves_no_folder_it_made(tmp_path):
    """`wan-trt bench --out new/folder/bench.json` that failed left new/folder behind, empty."""
    from wan_trt.outputs import locked_out_file
    (tmp_path / "kept").mkdir()
    for parent in (tmp_path / "new" / "folder", tmp_path / "kept"):
        with pytest.raises(RuntimeError, match="the run failed"):
            with locked_out_file(parent / "bench.json", "--out", lambda p: True, "bench report", overwrite=False,
                                 writer="bench"):
                assert parent.is_dir()
                raise RuntimeError("the run failed")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["kept"]  # the folder that was there stays


@pytest.mark.parametrize("command", ["bench", "build", "export"])
def test_an_output_name_too_long_for_the_files_written_beside_it_is_refused_before_any_work(plain_export, tmp_path,
                                                                                             command):
    """A name that fits the file system but not the files wan-trt stages beside it (`.NAME.partial-XXXXXXXX`; an
    engine's `.NAME.runtime.txt.partial-XXXXXXXX`) failed only when they were written: a bench after all its rows, a
    build after its compile, with 'File name too long'. A name with just the room they need is written."""
    import os
    limit = os.pathconf(tmp_path, "PC_NAME_MAX")
    room = {"bench": 18, "build": 30, "export": 18}[command]
    suffix = {"bench": ".json", "build": ".pt2", "export": ""}[command]
    args = {"bench": ["bench", str(plain_export), "--device", "cpu", "--blocks", "2", "--backends", "torch-eager"],
            "build": ["build", str(plain_export), "--backend", "aoti", "--device", "cpu"],
            "export": ["export", "--config", CFG, "--precision", "fp32", "--no-onnx"]}[command]
    out = tmp_path / ("n" * (limit - room + 1 - len(suffix)) + suffix)
    res = CliRunner().invoke(main, [*args, "--out", str(out)])
    assert res.exit_code == 1 and f"its name is {len(out.name)} bytes" in res.output, res.output
    assert f"pick a name of at most {limit - room} bytes" in res.output
    assert "ms/block" not in res.output and "compile" not in res.output  # refused before any work
    assert sorted(p.name for p in tmp_path.iterdir()) == []
    if command != "build":  # the longest name that fits is written (a build's takes its compile: not here)
        fits = tmp_path / ("n" * (limit - room - len(suffix)) + suffix)
        res = CliRunner().invoke(main, [*args, "--out", str(fits)])
        assert res.exit_code == 0 and fits.exists(), res.output


def test_an_engine_name_whose_suffix_its_staged_copy_repeats_is_held_to_that_room(tmp_path):
    """A build stages its engine as `.E.partial-XXXXXXXX<E's suffix>`: a TensorRT plan's free-form suffix (e.g.
    `.engine_h200_bf16_v2`) longer than 12 bytes needs more room than the runtime file's 30 bytes."""
    import os
    from wan_trt.engines.artifact import check_engine_out
    limit = os.pathconf(tmp_path, "PC_NAME_MAX")
    suffix = ".engine_h200_bf16_v2"
    engine = tmp_path / ("e" * (limit - 18 - len(suffix) + 1) + suffix)  # past the staged engine's room only
    with pytest.raises(WanTrtError, match=f"pick a name of at most {limit - 18 - len(suffix)} bytes"):
        check_engine_out(engine)


def test_a_run_that_found_the_folder_another_run_made_survives_that_runs_failure(tmp_path):
    """Run A made new/ for its report; run B found new/ there (made nothing); A failed and removed new/ (still empty:
    B had not taken its lock yet), and B's lock then failed with a bare FileNotFoundError. A removes only what it
    made, and a lock whose folder is gone makes it again."""
    from wan_trt.outputs import locked_out_file, make_parent, output_lock
    new = tmp_path / "new"
    with pytest.raises(RuntimeError, match="A failed"):
        with locked_out_file(new / "a.json", "--out", lambda p: True, "bench report", overwrite=False, writer="bench"):
            assert make_parent(new / "b.json", "--out") == []  # B: the folder is there, not B's
            raise RuntimeError("A failed")
    assert not new.exists()  # A removed the folder it made, empty: B's lock comes next
    with output_lock(new / "b.json", "bench"):
        (new / "b.json").write_text("{}")
    assert (new / "b.json").is_file() and not (new / ".b.json.lock").exists()


def test_a_build_that_fails_leaves_no_folder_it_made_for_its_engine(tmp_path):
    """`build --out new/deeper/e.pt2` whose build failed (here: its checkpoint changed since the export) left the
    folders it had made for the engine."""
    cfg = load_config(CFG)
    checkpoint = save_checkpoint(build_model(cfg, seed=3), tmp_path / "ckpt.safetensors")
    _export(tmp_path / "export", weights=str(checkpoint))
    save_checkpoint(build_model(cfg, seed=4), checkpoint)
    res = CliRunner().invoke(main, ["build", str(tmp_path / "export"), "--backend", "aoti", "--device", "cpu",
                                    "--out", str(tmp_path / "new" / "deeper" / "e.pt2")])
    assert res.exit_code == 1 and "has changed" in res.output, res.output
    assert not (tmp_path / "new").exists()


def test_an_out_through_a_folder_not_there_and_back_makes_no_folder(tmp_path, plain_export):
    """`--out EXPORT/new/..` (EXPORT an export) made EXPORT/new for its lock file before the export was refused,
    and that folder then blocked every `export --overwrite` of EXPORT."""
    out = tmp_path / "export"
    shutil.copytree(plain_export, out)
    with pytest.raises(WanTrtError, match="already holds an export"):
        _export(out / "new" / "..")
    assert _tree(out) == _tree(plain_export)
    _export(out, overwrite=True)


def test_an_out_under_a_dangling_link_is_refused_and_makes_nothing(tmp_path):
    """`--out LINK/x`, LINK a link to a folder that does not exist, made that folder (wherever the link pointed), where
    `--out LINK` is refused."""
    (tmp_path / "link").symlink_to(tmp_path / "missing")
    with pytest.raises(WanTrtError, match="symbolic link to .*missing, which does not exist"):
        _export(tmp_path / "link" / "x")
    assert not (tmp_path / "missing").exists()


@pytest.mark.parametrize("command", ["export", "decoder", "build", "bench"])
def test_an_out_in_a_link_loop_is_refused_in_a_line(tmp_path, plain_export, command):
    """`--out LOOP/x`, LOOP a symbolic link loop, ended in a RuntimeError traceback (a decoder export's two graphs, and
    a bench's --out beside its --chart, too). The loop is found by asking each link, as Path.resolve raises on one
    only before Python 3.13."""
    (tmp_path / "a").symlink_to(tmp_path / "b")
    (tmp_path / "b").symlink_to(tmp_path / "a")
    export = ["export", "--config", CFG, "--no-onnx", "--out", str(tmp_path / "a" / "x")]
    args = {"export": export, "decoder": [*export, "--graph", "decoder"],
            "build": ["build", str(plain_export), "--backend", "aoti", "--device", "cpu", "--out",
                      str(tmp_path / "a" / "e.pt2")],
            "bench": ["bench", str(plain_export), "--device", "cpu", "--backends", "torch-eager", "--blocks", "2",
                      "--out", str(tmp_path / "a" / "b.json"), "--chart", str(tmp_path / "c.png")]}[command]
    res = CliRunner().invoke(main, args)
    assert res.exit_code == 1 and "symbolic link loop" in res.output and "Traceback" not in res.output, res.output


@pytest.mark.parametrize("command", ["export", "build"])
def test_weights_given_as_a_pipe_are_named_as_one(tmp_path, plain_export, command):
    """`--weights <(cat ckpt)` was reported as 'no such file'."""
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    args = (["export", "--config", CFG, "--no-onnx", "--out", str(tmp_path / "out")] if command == "export" else
            ["build", str(plain_export), "--backend", "aoti", "--device", "cpu", "--out", str(tmp_path / "e.pt2")])
    res = CliRunner().invoke(main, [*args, "--weights", str(fifo)])
    assert res.exit_code == 1 and f"--weights {fifo}: a pipe" in res.output, res.output


def test_a_decoder_export_whose_two_graphs_are_one_folder_is_refused(tmp_path):
    """`export --graph decoder --out OUT` with OUT/first a link to OUT/steady waited on its own lock and said another
    export was writing OUT/steady."""
    out = tmp_path / "dec"
    (out / "steady").mkdir(parents=True)
    (out / "first").symlink_to("steady")
    res = CliRunner().invoke(main, ["export", "--config", CFG, "--graph", "decoder", "--no-onnx", "--out", str(out)])
    assert res.exit_code == 1 and "are one folder" in res.output and "another wan-trt" not in res.output, res.output


def _resealed(directory, name):
    """The manifest's record of ``name`` rewritten for the file as it is now (an edit that keeps the digests true)."""
    from wan_trt.digest import file_digest
    path = directory / "manifest.json"
    data = json.loads(path.read_text())
    data["files"][name] = file_digest(directory / name)
    path.write_text(json.dumps(data))


@pytest.mark.parametrize("edit", ["shape", "missing", "damaged"])
def test_sample_inputs_that_are_not_the_specs_inputs_are_refused(tmp_path, plain_export, edit):
    """Sample inputs of another shape (their digest re-recorded) had a build trace and compile an engine for that
    shape under the spec's name, and a check end in a traceback; a missing input or a damaged file ended in a KeyError
    or a parser's traceback. They are refused naming the file."""
    from safetensors.torch import load_file, save_file
    out = tmp_path / "export"
    shutil.copytree(plain_export, out)
    path = out / "sample_inputs.safetensors"
    feeds = load_file(str(path))
    if edit == "shape":
        feeds["visual_context"] = torch.cat([feeds["visual_context"]] * 2, dim=1)
    elif edit == "missing":
        del feeds["visual_context"]
    save_file(feeds, str(path))
    if edit == "damaged":
        path.write_bytes(path.read_bytes()[:100])
    _resealed(out, path.name)
    expected = {"shape": "input 'visual_context': expected", "missing": "missing input 'visual_context'",
                "damaged": "not a readable safetensors file"}[edit]
    with pytest.raises(WanTrtError, match=re.escape(f"{path}: ") + ".*" + re.escape(expected)):
        Manifest.read(out).sample_feeds(out)
    res = CliRunner().invoke(main, ["build", str(out), "--backend", "aoti", "--device", "cpu"])
    assert res.exit_code == 1 and expected in res.output and "Traceback" not in res.output, res.output
    assert not list(out.glob("engine_*"))
