"""The check's report files: one per engine checked, saying what was checked and how, never left over from an
earlier check, and strict JSON."""
import json
import shutil
from pathlib import Path

import pytest

from wan_trt.errors import WanTrtError
from wan_trt.validate.check import CheckOptions, CheckReport, OutputCheck, check_engine
from wan_trt.validate.metrics import error_stats
from tests.engines.backends.test_aoti import _copy_engine


@pytest.fixture
def two_engines(aoti, tmp_path):
    """A copy of the shared export with the same CPU engine under two names, both recorded as built from it."""
    export_dir, engine = aoti
    export = tmp_path / "export"
    shutil.copytree(export_dir, export, ignore=shutil.ignore_patterns("engine*", "check"))
    engines = []
    for name in ("engine_a.pt2", "engine_b.pt2"):
        copy = _copy_engine(engine, export / name)
        meta = json.loads(copy.with_name(copy.name + ".json").read_text())
        meta["export_dir"] = str(export.resolve())
        copy.with_name(copy.name + ".json").write_text(json.dumps(meta))
        engines.append(copy)
    return export, engines


def test_each_engine_checked_keeps_its_own_report_saying_what_was_checked(two_engines):
    """Every engine of one backend wrote check/report_aoti.json: the second check replaced the first's report
    without a word, and nothing in it said which engine, device or options it was."""
    export, engines = two_engines
    check_engine(engines[0], CheckOptions(blocks=2, seed=1, save_results=False))
    check_engine(engines[1], CheckOptions(stream=False, save_results=False))
    reports = {p.name: json.loads(p.read_text()) for p in sorted((export / "check").glob("report_*.json"))}
    assert set(reports) == {"report_engine_a.pt2.json", "report_engine_b.pt2.json"}
    a, b = reports["report_engine_a.pt2.json"], reports["report_engine_b.pt2.json"]
    assert a["target"] == str(engines[0].resolve()) and b["target"] == str(engines[1].resolve())
    recorded = json.loads(engines[0].with_name(engines[0].name + ".json").read_text())["engine_file"]["sha256"]
    assert a["engine_sha256"] == b["engine_sha256"] == recorded and a["device"] == "cpu"
    assert a["options"]["stream"] and a["options"]["blocks"] == 2 and len(a["stream"]) == 2 + 4
    assert not b["options"]["stream"] and b["stream"] == [] and b["command"]
    assert b["options"]["blocks"] is None and b["options"]["seed"] is None  # no stream ran: none of its settings


def test_a_check_that_stops_half_way_leaves_no_report_behind(two_engines, monkeypatch):
    """The report was written only when a check ended: one that failed half-way left the earlier check's report
    (ok: true) beside its own new results."""
    import wan_trt.validate.check as check
    export, engines = two_engines
    check_engine(engines[0], CheckOptions(stream=False, save_results=False))
    report = export / "check" / "report_engine_a.pt2.json"
    assert json.loads(report.read_text())["ok"]

    def stopped(*args, **kwargs):
        raise WanTrtError("stopped half-way")

    monkeypatch.setattr(check, "check_single_pass", stopped)
    with pytest.raises(WanTrtError, match="stopped half-way"):
        check_engine(engines[0], CheckOptions(stream=False, save_results=False))
    assert not report.exists()


def test_a_report_with_non_finite_numbers_is_strict_json():
    """Failing rows hold NaN and Inf, which json.dumps wrote as NaN and Infinity: not JSON, so a strict reader
    got no result at all. They are null (the rows' non_finite counts say why)."""
    nan = float("nan")
    broken = error_stats(*[__import__("torch").tensor([1.0, nan])] * 2)
    report = CheckReport("aoti", "bf16", outputs=[OutputCheck("flow", broken, broken, nan, False)],
                         stream=[{"block": 0, "rel_l2": float("inf"), "yardstick_rel_l2": nan, "ok": False}])
    data = json.loads(json.dumps(report.as_dict(), allow_nan=False))
    assert data["stream"][0]["rel_l2"] is None and data["stream"][0]["yardstick_rel_l2"] is None
    assert data["single_pass"][0]["allowed_rel_l2"] is None and data["single_pass"][0]["non_finite"] == 1
    assert not data["ok"]


def test_each_engine_keeps_its_own_run_results_and_none_outlive_a_check_that_saves_none(two_engines):
    """Polygraphy's RunResults were check/run_results_<backend>.json, shared by every engine of a backend, and a
    check with --no-save-results left an earlier check's beside its own report."""
    export, engines = two_engines
    results = {e.stem: export / "check" / f"run_results_{e.name}.json" for e in engines}
    for engine in engines:
        check_engine(engine, CheckOptions(stream=False, save_results=True))
    assert all(path.is_file() for path in results.values())
    check_engine(engines[0], CheckOptions(stream=False, save_results=False))
    assert not results["engine_a"].exists() and results["engine_b"].is_file()


def test_engines_of_one_file_name_in_two_folders_keep_their_own_reports(two_engines, tmp_path):
    """Reports were named by the engine file's stem only: a second engine of one export with the same file name
    in another folder deleted and replaced the first's report."""
    export, engines = two_engines
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    moved = _copy_engine(engines[0], elsewhere / engines[0].name)  # engine_a.pt2 again, in another folder
    check_engine(engines[0], CheckOptions(stream=False, save_results=False))
    check_engine(moved, CheckOptions(stream=False, save_results=False))
    reports = [json.loads(p.read_text()) for p in sorted((export / "check").glob("report_engine_a*.json"))]
    assert sorted(r["target"] for r in reports) == sorted(str(p.resolve()) for p in (engines[0], moved))


def test_run_results_that_fail_to_save_leave_no_partial_file_and_name_it(two_engines, monkeypatch):
    """Polygraphy wrote its RunResults straight to their final name: a disk that filled up mid-save left a
    truncated file there (invalid JSON under a name that says results), and the error named no file."""
    import errno

    from polygraphy.comparator import RunResults

    from wan_trt.errors import WanTrtError
    export, engines = two_engines

    def full_disk(self, dest):
        with open(dest, "w") as f:
            f.write('{"lst": [["truncat')
        raise OSError(errno.ENOSPC, "No space left on device")
    monkeypatch.setattr(RunResults, "save", full_disk)
    results = export / "check" / f"run_results_{engines[0].name}.json"
    with pytest.raises(WanTrtError, match=f"{results.name}.*No space left on device"):
        check_engine(engines[0], CheckOptions(stream=False, save_results=True))
    assert not results.exists() and not list((export / "check").glob(f".{results.name}*"))


def _reexport(export):
    """`wan-trt export --overwrite` of ``export`` (another seed): a new folder swapped in under its path."""
    from wan_trt.config_load import load_config
    from wan_trt.export.transformer import export_transformer
    export_transformer(load_config("universal-small"), export, "fp32", seed=1, onnx=False, overwrite=True)


def _outside_its_export(engine, tmp_path):
    """A copy of ``engine`` in another folder (as `build --out` puts one): it outlives its export's swap."""
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    return _copy_engine(engine, elsewhere / engine.name)


def test_a_check_of_an_export_replaced_while_it_ran_writes_no_report(two_engines, monkeypatch):
    """`export --overwrite` of the folder a check was checking (nothing stops it: a check takes no lock) swapped
    a new export in, and the check wrote its passing report into it: a report for a graph it never ran. The
    check now sees the folder replaced and fails, writing nothing."""
    import wan_trt.validate.check as check
    export, engines = two_engines
    real = check.check_single_pass

    def replaced_meanwhile(*args, **kwargs):
        rows = real(*args, **kwargs)
        _reexport(export)
        return rows
    monkeypatch.setattr(check, "check_single_pass", replaced_meanwhile)
    with pytest.raises(WanTrtError, match="was replaced while it was checked"):
        check_engine(engines[0], CheckOptions(stream=False, save_results=False))
    assert not list(export.glob("check/report_*.json"))


def test_a_check_of_an_export_replaced_before_its_engine_ran_writes_no_report(two_engines, tmp_path, monkeypatch):
    """The check took the export folder's identity only once it had read and verified the manifest and the engine
    and made the engine's runner (hashing gigabytes at full size): an `export --overwrite` in that window went
    unseen, and the check ran the engine against the old export's references but wrote its report into the new
    folder. The identity is now taken before the manifest is read."""
    import wan_trt.engines.backends.aoti as aoti
    export, engines = two_engines
    engine = _outside_its_export(engines[0], tmp_path)
    real = aoti.check_runners

    def replaced_once_made(*args, **kwargs):
        runners = real(*args, **kwargs)
        _reexport(export)
        return runners
    monkeypatch.setattr(aoti, "check_runners", replaced_once_made)
    with pytest.raises(WanTrtError, match="replaced while"):
        check_engine(engine, CheckOptions(stream=False, save_results=False))
    assert not list(export.glob("check/report_*.json"))


def test_a_check_of_an_export_replaced_while_it_ran_leaves_no_run_results_in_it(two_engines, tmp_path, monkeypatch):
    """The RunResults were put in place as soon as Polygraphy had run, long before the check looked for a replaced
    folder: a check of an export replaced before its single pass wrote no report but left the RunResults of a
    graph that is not there in the new folder. They now stay in a staging file, put in place only once the
    folder is found unreplaced, and removed otherwise."""
    import wan_trt.validate.check as check
    export, engines = two_engines
    engine = _outside_its_export(engines[0], tmp_path)
    real = check.check_single_pass

    def replaced_first(*args, **kwargs):
        _reexport(export)
        return real(*args, **kwargs)
    monkeypatch.setattr(check, "check_single_pass", replaced_first)
    with pytest.raises(WanTrtError, match="was replaced while it was checked"):
        check_engine(engine, CheckOptions(stream=False, save_results=True))
    assert not list(export.glob("check/run_results_*.json")) + list(export.glob("check/.run_results_*partial*"))
    assert not list(export.glob("check/report_*.json"))


def test_a_check_of_an_export_replaced_once_its_manifest_was_verified_writes_no_report(two_engines, tmp_path,
                                                                                      monkeypatch):
    """An engine's export is found by its manifest's hash, read and verified (hashing gigabytes at full size)
    before the folder is known: an `export --overwrite` right after that went unseen, and the check wrote its
    report and RunResults into the new folder. The folder's manifest is now read again once its identity is
    taken, and a new one refused."""
    from wan_trt.export.manifest import Manifest
    export, engines = two_engines
    engine = _outside_its_export(engines[0], tmp_path)
    verify, swapped = Manifest.verify_files, []

    def verified_then_replaced(self, directory, *args, **kwargs):
        verify(self, directory, *args, **kwargs)
        if not swapped:
            swapped.append(directory)
            _reexport(export)
    monkeypatch.setattr(Manifest, "verify_files", verified_then_replaced)
    with pytest.raises(WanTrtError, match="was replaced while it was checked"):
        check_engine(engine, CheckOptions(stream=False, save_results=True))
    assert swapped and not [p.name for p in (export / "check").glob("*")]


def test_a_check_replaced_between_its_last_look_and_placing_its_run_results_says_so(two_engines, tmp_path,
                                                                                    monkeypatch):
    """A folder replaced after the check's last look but before its RunResults were renamed into place made the
    rename fail, reported as 'writing .../run_results_....json failed: No such file or directory; ... free some
    space, or check the folder's permissions'. It is the replaced folder, and said so."""
    import wan_trt.validate.check as check
    export, engines = two_engines
    engine = _outside_its_export(engines[0], tmp_path)
    look, swapped = check.require_unreplaced, []

    def replaced_after_the_look(*args):
        look(*args)
        if not swapped:
            swapped.append(True)
            _reexport(export)
    monkeypatch.setattr(check, "require_unreplaced", replaced_after_the_look)
    with pytest.raises(WanTrtError, match="was replaced while it was checked"):
        check_engine(engine, CheckOptions(stream=False, save_results=True))
    assert swapped and not list(export.glob("check/*run_results_*"))


def test_the_staging_files_of_a_killed_check_go_with_the_next_check_of_its_target(two_engines):
    """A check keeps its RunResults (gigabytes at full size) in a staging file until its end: one killed meanwhile
    left it, and no later check removed it (only a re-export did). The next check of the same target removes the
    staging files it recognises as a check's; another target's and a user's file of another name stay."""
    from wan_trt.outputs import staging_file
    export, engines = two_engines
    check_dir = export / "check"
    killed = [staging_file(check_dir / name) for name in ("run_results_engine_a.pt2.json", "report_engine_a.pt2.json")]
    other = staging_file(check_dir / "run_results_engine_b.pt2.json")
    users = check_dir / ".run_results_engine_a.pt2.json.partial-mine"
    users.write_text("the user's")
    check_engine(engines[0], CheckOptions(stream=False, save_results=True))
    assert not any(p.exists() for p in killed) and other.exists() and users.read_text() == "the user's"
    assert (check_dir / "run_results_engine_a.pt2.json").is_file()


def test_an_error_of_the_check_itself_is_not_blamed_on_its_run_results(two_engines, monkeypatch):
    """With the RunResults kept in a staging file until the check's end, a user-fixable error of any later step
    (a file it could not read, here in the stream check) came out as a failed write of the RunResults, naming
    their file and not the one at fault. Only the save and the rename of the RunResults are reported so."""
    import errno

    import wan_trt.validate.check as check
    export, engines = two_engines

    def unreadable(*args, **kwargs):
        raise PermissionError(errno.EACCES, "Permission denied", "/data/unreadable.bin")
    monkeypatch.setattr(check, "check_stream", unreadable)
    with pytest.raises(PermissionError, match="unreadable.bin"):
        check_engine(engines[0], CheckOptions(blocks=2, save_results=True))
    assert not list(export.glob("check/run_results_*.json")) + list(export.glob("check/.run_results_*partial*"))


def test_a_report_names_the_device_its_check_ran_on(monkeypatch):
    """The report's environment named the machine's current GPU even for a check on the CPU (an ONNX Runtime
    CPU check on a GPU machine); it names the device the check ran on, as bench's files do."""
    import torch

    from wan_trt.validate.check import report_json
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda *args: "Some GPU")
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda *args: (9, 0))
    environment = json.loads(report_json(CheckReport("onnxruntime-cpu", "fp32", device="cpu")))["environment"]
    assert environment["device"] != "Some GPU" and "driver_capability" not in environment, environment


def test_engines_of_one_stem_in_one_export_keep_their_own_reports(two_engines):
    """Reports were named by the engine file's stem: engine_a.pt2 and engine_a.plan (or a package named after a
    runner, onnxruntime.pt2) shared one report, each check deleting the other's."""
    export, engines = two_engines
    twin = _copy_engine(engines[0], export / "engine_a.bin")
    meta = json.loads(twin.with_name(twin.name + ".json").read_text())
    twin.with_name(twin.name + ".json").write_text(json.dumps({**meta, "export_dir": str(export.resolve())}))
    check_engine(engines[0], CheckOptions(stream=False, save_results=False))
    check_engine(twin, CheckOptions(stream=False, save_results=False))
    reports = [json.loads(p.read_text()) for p in sorted((export / "check").glob("report_engine_a*.json"))]
    assert sorted(r["target"] for r in reports) == sorted(str(p.resolve()) for p in (engines[0], twin))


def test_a_report_left_under_an_engines_former_name_goes_when_it_is_checked_again(two_engines):
    """Reports were named by the engine's stem (report_engine_a.json); named by its file name now, a check of the
    same engine left the earlier pair beside its own, looking current. Another target's report of that name stays."""
    export, engines = two_engines
    check_dir = export / "check"
    check_dir.mkdir(exist_ok=True)
    earlier = {"command": "wan-trt check", "backend": "aoti", "precision": "fp32", "ok": True}
    (check_dir / "report_engine_a.json").write_text(json.dumps({**earlier, "target": str(engines[0].resolve())}))
    (check_dir / "report_engine_b.json").write_text(json.dumps({**earlier, "target": "/elsewhere/engine_b.pt2"}))
    for engine in engines:
        check_engine(engine, CheckOptions(stream=False, save_results=False))
    assert sorted(p.name for p in check_dir.glob("report_*.json")) == [
        "report_engine_a.pt2.json", "report_engine_b.json", "report_engine_b.pt2.json"]


def test_a_second_check_of_a_target_being_checked_is_refused_and_the_first_keeps_its_results(two_engines,
                                                                                              monkeypatch):
    """A second check of the same target, started while the first ran, removed the first's staged RunResults as a
    killed check's: the first then failed at its very end ("writing run_results_...: No such file or directory;
    free some space"), its report lost, the second's left in its place. The second is refused at once now."""
    import wan_trt.validate.check as check
    export, engines = two_engines
    real, refused = check.check_stream, []

    def second_check_meanwhile(*args, **kwargs):
        with pytest.raises(WanTrtError, match="another wan-trt check is writing .*report_engine_a.pt2.json") as exc:
            check_engine(engines[0], CheckOptions(stream=False, save_results=False))
        refused.append(str(exc.value))
        return real(*args, **kwargs)
    monkeypatch.setattr(check, "check_stream", second_check_meanwhile)
    report = check_engine(engines[0], CheckOptions(blocks=1, save_results=True))
    assert refused and report.ok
    assert (export / "check" / "run_results_engine_a.pt2.json").is_file()
    assert json.loads((export / "check" / "report_engine_a.pt2.json").read_text())["options"]["blocks"] == 1
    assert sorted(p.name for p in (export / "check").iterdir()) == ["report_engine_a.pt2.json",
                                                                    "run_results_engine_a.pt2.json"]  # no lock left


def test_a_rebuilt_engine_keeps_no_report_of_the_engine_it_replaced(two_engines, monkeypatch):
    """A build that replaced a checked engine (`build --force`, or a rebuild for newer tools) left the old engine's
    report and RunResults in check/, still saying ok: true for the engine's path, which now held an engine no check
    had run. They go with the engine they were of; another engine's stay."""
    import torch

    from wan_trt.engines.backends.aoti import build_aoti
    export, engines = two_engines
    for engine in engines:
        check_engine(engine, CheckOptions(stream=False, save_results=True))
    rebuilt = engines[0].read_bytes() + b"\0"  # another build's bytes: Inductor is not under test

    def compile_stand_in(program, package_path):
        Path(package_path).write_bytes(rebuilt)
    monkeypatch.setattr(torch._inductor, "aoti_compile_and_package", compile_stand_in)
    build_aoti(export, engines[0], device="cpu", force=True)
    assert sorted(p.name for p in (export / "check").iterdir()) == ["report_engine_b.pt2.json",
                                                                    "run_results_engine_b.pt2.json"]


def test_an_engine_replaced_once_the_check_verified_it_is_not_run_under_the_replaced_ones_sha256(two_engines,
                                                                                                 monkeypatch):
    """The check verified the engine against its metadata, then its runner read the metadata again and verified and
    loaded what was there by then: an engine a build installed in between ran, and passed, under the sha256 of the
    one it replaced. The check refuses it now."""
    import zipfile

    import wan_trt.engines.backends.aoti as aoti
    from wan_trt.engines.artifact import EngineMetadata, install_engine
    export, engines = two_engines
    rebuild = shutil.copy(engines[0], export / "rebuild.pt2")
    with zipfile.ZipFile(rebuild) as pkg:
        folder = pkg.namelist()[0].split("/")[0]
    with zipfile.ZipFile(rebuild, "a") as pkg:  # another build of the same package: other bytes, it loads
        pkg.writestr(f"{folder}/rebuilt.txt", "another build")
    real = aoti.check_runners

    def rebuilt_meanwhile(engine, manifest):
        install_engine(rebuild, engines[0], EngineMetadata.read(engines[0]))
        return real(engine, manifest)
    monkeypatch.setattr(aoti, "check_runners", rebuilt_meanwhile)
    with pytest.raises(WanTrtError, match="engine_a.pt2 was replaced or rewritten since it was verified"):
        check_engine(engines[0], CheckOptions(stream=False, save_results=False))
    assert not (export / "check" / "report_engine_a.pt2.json").exists()


def test_a_check_whose_engine_a_build_replaced_while_it_ran_writes_no_report(two_engines, monkeypatch):
    """A build that installed another engine while a check of its path ran (the check had loaded the old one) left
    the check's report, written at its end, saying ok: true for the path, which held an engine no check had run."""
    import zipfile

    import wan_trt.validate.check as check
    from wan_trt.engines.artifact import EngineMetadata, install_engine
    export, engines = two_engines
    rebuild = shutil.copy(engines[0], export / "rebuild.pt2")
    with zipfile.ZipFile(rebuild, "a") as pkg:  # another build's bytes
        pkg.writestr("rebuilt.txt", "another build")
    real = check.check_single_pass

    def rebuilt_meanwhile(*args, **kwargs):
        rows = real(*args, **kwargs)
        install_engine(rebuild, engines[0], EngineMetadata.read(engines[0]))
        return rows
    monkeypatch.setattr(check, "check_single_pass", rebuilt_meanwhile)
    with pytest.raises(WanTrtError, match="engine_a.pt2 was replaced while it was checked"):
        check_engine(engines[0], CheckOptions(stream=False, save_results=True))
    assert not list((export / "check").glob("*engine_a*"))


def test_a_file_where_the_checks_folder_goes_is_named_not_taken_for_a_full_disk(tmp_path):
    """A file named `check` in an export (where a check writes its reports) failed the check with 'File exists;
    ... (free some space, or check the folder's permissions)'."""
    from wan_trt.validate.check import report_locked, report_path
    (tmp_path / "check").write_text("notes of mine")
    with pytest.raises(WanTrtError, match=r"check is a file, not the folder the check writes its reports in; move it "
                                          r"away and check again"):
        with report_locked(report_path(tmp_path, "onnxruntime-cpu")):
            pass
    assert (tmp_path / "check").read_text() == "notes of mine"
