"""Safe outputs: wan-trt replaces only what it wrote, stages new outputs, and locks the target.

An export is written into a staging directory that wan-trt creates itself
(``.<name>.partial-XXXX`` next to ``--out``, with a marker file), under an exclusive lock
(``.<name>.lock``), and renamed into place only when complete; the export it replaces is
moved aside first, so it survives a failed run, and only the files wan-trt wrote into it
are removed afterwards. ``--out`` is refused when it holds anything else, the current
directory or the input checkpoint. Engine files follow the same rules (:func:`check_engine_out`).

Which files of a folder an export wrote is the caller's to say (``owned_files``, e.g.
``wan_trt.owned.owned_export_files``); engines `wan-trt build` wrote are recognised
here (:func:`engine_files_in`); this module imports only wan_trt.errors and wan_trt.log, which need the standard
library alone (`make clean` runs :mod:`wan_trt.owned` on it where no environment is set up).
"""
from __future__ import annotations

import contextlib
import errno
import fcntl
import glob
import json
import math
import os
import re
import secrets
import shutil
import stat
import tempfile
from pathlib import Path
from typing import Any, Callable, Iterator, Sequence

from wan_trt.errors import USER_ERRNOS, WanTrtError
from wan_trt.log import logger

MARKER = ".wan-trt-export"  # inside every staging and finished output folder (exports, stream outputs)
MARKER_TEXT = "wan-trt {what} folder\n"  # the marker's text in an output of kind ``what``: written and read by it
CHECK_REPORT_KEYS = {"command", "backend", "precision", "ok"}  # in every check report
# the kinds of output folder wan-trt stages (``what``), each with the folders wan-trt makes in it that a run it stops
# may leave empty (an export's check/)
OUTPUT_KINDS = {"export": (Path("check"),), "stream output": ()}
# the files wan-trt wrote into an existing output folder, or None if it is not wan-trt's
OwnedFiles = Callable[[Path], list[Path] | None]


def os_error_message(exc: OSError, doing: str, fix: str) -> WanTrtError | None:
    """A WanTrtError for an OSError the user can fix (disk full, permissions...); None for anything else."""
    if exc.errno not in USER_ERRNOS:
        return None
    return WanTrtError(f"{doing} failed: {exc.strerror or exc}{f' ({exc.filename})' if exc.filename else ''}; {fix}")


# What the names of the files wan-trt writes beside an output NAME add to it, at most: an export's, stream's or
# report's staging `.NAME.partial-XXXXXXXX` (its lock `.NAME.lock` and an export's `.NAME.old-XXXXXXXX` add less);
# an engine's, see engine_name_room.
BESIDE_OUTPUT = len(".partial-XXXXXXXX") + 1


def engine_name_room(engine: Path) -> int:
    """What the files a build writes beside ``engine`` add to its name: its staged runtime file
    `.E.runtime.txt.partial-XXXXXXXX`, or its staged engine `.E.partial-XXXXXXXX<E's suffix>` with a long suffix."""
    return max(len(".runtime.txt.partial-XXXXXXXX") + 1, BESIDE_OUTPUT + len(os.fsencode(engine.suffix)))


def check_parent_chain(path: Path, flag: str, room: int = BESIDE_OUTPUT) -> None:
    """Refuse a path under a regular file, whose nearest existing folder cannot be written, or whose name (or that
    of a folder to make for it) leaves no ``room`` bytes in the file system's name limit for the files written
    beside it (that failed only when they were written: after a bench's rows or a build's compile)."""
    for parent in path.parents:
        if parent.exists():
            if not parent.is_dir():
                raise WanTrtError(f"{flag} {path}: {parent} is a file, not a folder; pick a path in a folder")
            if not os.access(parent, os.W_OK | os.X_OK):
                raise WanTrtError(f"{flag} {path}: folder {parent} is not writable; pick another {flag}")
            _check_name_room(path, parent, flag, room)
            return


def _check_name_room(path: Path, existing: Path, flag: str, beside: int) -> None:
    try:
        limit = os.pathconf(existing, "PC_NAME_MAX")
    except (OSError, ValueError):  # no limit known: the write itself will say
        return
    for made in [*(q for q in path.parents if existing in q.parents), path]:  # the folders to make, then itself
        size = len(os.fsencode(made.name))
        room = beside if made == path else 0
        if size + room > limit:
            what = "its name" if made == path else f"the name of the folder {made} to make for it"
            files = f"; wan-trt stages files beside it whose names add up to {room} bytes to it" if room else ""
            raise WanTrtError(f"{flag} {path}: {what} is {size} bytes{files}, past the {limit} a name can have in "
                              f"{existing}: pick a name of at most {limit - room} bytes")


def is_lock_file(path: Path) -> bool:
    """Whether ``path`` is shaped as the lock :func:`output_lock` holds (an empty regular file), as one a killed
    build or check leaves is."""
    return not path.is_symlink() and path.is_file() and path.stat().st_size == 0


@contextlib.contextmanager
def output_lock(target: Path, what: str, fix: str = "wait for it to finish or pick another output path"
                ) -> Iterator[None]:
    """Hold an exclusive lock on ``target`` (lock file beside it, removed afterwards); fail at once if held, saying
    ``fix``."""
    lock = target.with_name(f".{target.name}.lock")
    if (lock.exists() or lock.is_symlink()) and not is_lock_file(lock):
        raise WanTrtError(f"{lock} is in the way of wan-trt's lock for {target} (an empty file it creates and "
                          "removes): it is not one, and is never removed; move it away or pick another output path")
    remade = False
    while True:
        try:
            fd = os.open(lock, os.O_RDWR | os.O_CREAT, 0o644)
        except FileNotFoundError:  # its folder, made by another run that failed, was removed by it: make it again
            if remade:
                raise
            lock.parent.mkdir(parents=True, exist_ok=True)
            remade = True
            continue
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise WanTrtError(f"another wan-trt {what} is writing {target} (lock {lock}); {fix}") from None
        with contextlib.suppress(FileNotFoundError):
            if os.stat(lock).st_ino == os.fstat(fd).st_ino:
                break  # the lock file we hold is still the one at that path
        os.close(fd)  # its holder removed it while we waited: take the new one
    try:
        yield
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(lock)
        os.close(fd)


# What `wan-trt build` writes beside an engine E while it runs: its lock file ``.E.lock`` (empty) and
# mkstemp's staging files ``.E.partial-XXXXXXXX<E's suffix>`` (the engine) and ``.E.json.partial-XXXXXXXX``
# (its metadata), XXXXXXXX in mkstemp's alphabet.
BUILD_FILE = re.compile(r"^\.(?P<engine>.+?)(?:\.lock|(?P<meta>\.json)?\.partial-[a-z0-9_]{8}(?P<suffix>.*))$")
DEFAULT_ENGINE = re.compile(r"^engine_[a-z0-9_-]+\.(?:pt2|plan)$")  # engines/artifact.default_engine_path's names


def build_file_of(path: Path) -> str | None:
    """The engine name whose build wrote ``path`` (a lock or staging file of the shape above; a lock file
    empty), or None if it is not such a file."""
    match = BUILD_FILE.match(path.name)
    if match is None or path.is_symlink() or not path.is_file():
        return None
    engine = match["engine"]
    if path.name.endswith(".lock"):
        shaped = path.name == f".{engine}.lock" and is_lock_file(path)
    else:
        shaped = match["suffix"] == ("" if match["meta"] else Path(engine).suffix)
    return engine if shaped else None


def is_known_engine(directory: Path, name: str) -> bool:
    """Whether ``name`` in ``directory`` is an engine `wan-trt build` makes there: a default name, or one whose
    build metadata is beside it."""
    return DEFAULT_ENGINE.match(name) is not None or written_by_build(directory / f"{name}.json")


def lock_held(lock: Path) -> bool:
    """Whether a process holds ``lock`` (a lock file of :func:`output_lock`) now. The probe asks for a shared
    lock, so that two probes never see each other as holders."""
    try:
        fd = os.open(lock, os.O_RDONLY)
    except FileNotFoundError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(fd)  # releases it if we got it
    return False


def build_leftovers(directory: Path) -> tuple[list[Path], list[Path]]:
    """(stale files a killed build left in ``directory``, lock files a running build holds). While any
    build holds its lock, none of its files is stale."""
    files = {path: engine for path in directory.iterdir() if (engine := build_file_of(path)) is not None}
    locked = {engine for path, engine in files.items() if path.name.endswith(".lock")}
    staged = {engine for path, engine in files.items() if not path.name.endswith(".lock")}
    # an engine of the user's name whose first build was killed has no metadata yet: its lock and staging file
    # together say what they are
    leftovers = [path for path, engine in files.items()
                 if is_known_engine(directory, engine) or (engine in locked and engine in staged)]
    held = [path for path in leftovers if path.name.endswith(".lock") and lock_held(path)]
    return ([] if held else leftovers), held


def remove_stale_partials(engine: Path) -> None:
    """The staging files a killed build of ``engine`` left beside it; call while holding its lock."""
    for path in engine.parent.glob(f".{glob.escape(engine.name)}.*partial-*"):
        if build_file_of(path) == engine.name:
            logger.info("removing %s, left by an interrupted build", path)
            path.unlink(missing_ok=True)


def resolved(path: Path, flag: str) -> Path:
    """``path`` absolute, its symbolic links and '..' taken (as :meth:`Path.resolve`), a link loop refused (Path.resolve
    raises on one before Python 3.13 and returns it unresolved after: each link is asked itself)."""
    path = Path(path)
    for link in (p for p in (path, *path.parents) if p.is_symlink()):
        try:
            os.stat(link)
        except OSError as exc:
            if exc.errno == errno.ELOOP:
                raise WanTrtError(f"{flag} {path}: {link} is a symbolic link loop; pick another {flag}") from None
    try:
        return path.resolve()
    except RuntimeError as exc:  # a loop met on the way (Python before 3.13)
        raise WanTrtError(f"{flag} {path}: a symbolic link loop ({exc}); pick another {flag}") from None


def followed(out: Path, flag: str = "--out") -> Path:
    """``out``, or where it points if it is a symbolic link: an output replaces its folder by renames, which
    would replace the link itself (the user's link gone, the folder it pointed to emptied). A path with '..'
    in it is taken as the folder it names (its lock and staging files go beside that, not into a folder
    '..' leaves, which would be made)."""
    if not out.is_symlink():
        return resolved(out, flag) if ".." in out.parts else out
    target = resolved(out, flag)
    if not target.exists():
        raise WanTrtError(f"{flag} {out} is a symbolic link to {target}, which does not exist; create that "
                          f"folder or pass another {flag}")
    logger.info("%s %s is a link: writing %s", flag, out, target)
    return target


def json_with_keys(path: Path, keys: set[str]) -> dict | None:
    """``path``'s JSON object if it holds (at least) ``keys`` (how wan-trt knows a file it wrote), else None."""
    try:
        data = json.loads(path.read_bytes().decode("utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        return None
    return data if isinstance(data, dict) and keys <= set(data) else None


def json_values(value: Any) -> Any:
    """``value`` with every non-finite float replaced by None (strict JSON holds no NaN or Infinity)."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: json_values(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_values(v) for v in value]
    return value


def written_by_check(path: Path) -> bool:
    """Whether ``path`` is a report `wan-trt check` wrote (a file named like one may be the user's)."""
    return json_with_keys(path, CHECK_REPORT_KEYS) is not None


def run_results(path: Path) -> bool:
    """Whether ``path`` is a Polygraphy RunResults file, as a check saves (judged by its ends: they run to
    gigabytes)."""
    try:
        with path.open("rb") as f:
            head = f.read(1)
            f.seek(max(0, path.stat().st_size - 256))
            tail = f.read()
    except OSError:
        return False
    return head == b"{" and re.search(rb'"polygraphy_class":\s*"RunResults"\s*}\s*$', tail) is not None


def staged_by_check(path: Path) -> bool:
    """Whether ``path`` is named as the staging file of a check's report or RunResults (:func:`staging_file`'s
    names: mkstemp's 8 characters after the prefix), which a killed check leaves."""
    return re.fullmatch(r"\.(report|run_results)_.+\.json\.partial-[a-z0-9_]{8}", path.name) is not None


# what `wan-trt check` adds to an export, each file judged by its content or its staging name (a user's file
# of such a name is not the check's)
CHECK_FILES = {"check/report_*.json": written_by_check, "check/run_results_*.json": run_results,
               "check/.report_*.json.partial-*": staged_by_check,
               "check/.run_results_*.json.partial-*": staged_by_check,
               "check/.report_*.json.lock": is_lock_file}


def check_files_in(directory: Path) -> list[Path]:
    """The files `wan-trt check` wrote (or was writing when it was killed) into the export ``directory``."""
    return [p for pattern, ours in CHECK_FILES.items() for p in sorted(directory.glob(pattern)) if ours(p)]


def written_by_build(meta: Path) -> bool:
    """Whether ``meta`` is engine metadata `wan-trt build` wrote (also a damaged or older one)."""
    return json_with_keys(meta, {"backend", "key", "spec_fingerprint", "export_dir"}) is not None


def engine_of_metadata(meta: Path) -> Path | None:
    """The engine ``E`` whose metadata ``meta`` would be (``E.json`` beside it), or None where ``meta`` is named as no
    engine's metadata: not ``*.json``, or ``.json`` itself (an engine of no name)."""
    if not meta.name.endswith(".json") or meta.name == ".json":
        return None
    return meta.with_name(meta.name[:-len(".json")])


def engine_files_in(directory: Path) -> list[Path]:
    """Engines built by wan-trt in ``directory`` with their metadata and runtime files."""
    found = []
    for meta in directory.glob("*.json"):
        engine = engine_of_metadata(meta)
        if engine is not None and written_by_build(meta):
            found += [p for p in (engine, meta, engine.with_name(engine.name + ".runtime.txt")) if p.is_file()]
    return found


def foreign_files(directory: Path, owned: list[Path], own_folders: Sequence[Path] = ()) -> list[str]:
    """Relative names of what ``directory`` holds besides ``owned``: files, links, empty folders other than
    ``own_folders`` and folders that cannot be read (named 'name/': replacing an output removes the folders
    it empties, and what cannot be read cannot be told to be wan-trt's). Folders holding only owned files
    pass."""
    keep = {p.resolve() for p in owned}
    found = []

    def unreadable(error: OSError) -> None:
        found.append(f"{Path(error.filename).relative_to(directory)}/")
    for root, dirs, files in os.walk(directory, onerror=unreadable):
        for name in files + [d for d in dirs if os.path.islink(os.path.join(root, d))]:
            path = Path(root, name)
            if path.resolve() not in keep or path.is_symlink():
                found.append(str(path.relative_to(directory)))
        folder = Path(root).relative_to(directory)
        if not dirs and not files and folder != Path(".") and folder not in own_folders:
            found.append(f"{folder}/")
    return sorted(found)


def check_out_dir(out: Path, owned_files: OwnedFiles, *, overwrite: bool, protect: Sequence[Path] = (),
                  what: str = "export") -> list[Path]:
    """Refuse an ``--out`` that may not be (re)written; return the old export's files to remove (if any).

    Refused: a path under a file or in an unwritable folder, a file, the current directory or a folder
    holding it, a folder holding a file in ``protect`` (the input checkpoint), a folder holding files
    wan-trt did not write (``owned_files`` of the folder), one a build is writing into, and an existing
    export without ``overwrite``. An empty folder is used as is; a symbolic link stands for its target.
    ``what`` names the kind of output in messages ("export", "stream output").
    What a killed build left (its lock and staging files, nobody holding the lock) counts as wan-trt's.
    """
    out = followed(out)
    real = resolved(out, "--out")
    check_parent_chain(real, "--out")
    cwd = Path.cwd().resolve()
    if real == cwd or real in cwd.parents:
        raise WanTrtError(f"--out {out} is the current directory or holds it; {_a(what)} replaces its whole --out "
                          "folder: pick a new folder, e.g. --out out/new")
    for path in filter(None, protect):
        if real in Path(path).resolve().parents:
            raise WanTrtError(f"--out {out} holds the input file {path}, which {_a(what)} never deletes; "
                              "pick another --out")
    if not out.exists():
        return []
    if not out.is_dir():
        raise WanTrtError(f"--out {out} is a file, not a folder; pick another --out")
    if os.path.ismount(out):
        raise WanTrtError(f"--out {out} is a mount point: {_a(what)} is written apart and renamed into place, which "
                          f"a mount point cannot take; give a folder inside it, e.g. --out {out / 'out'}")
    if not any(out.iterdir()):
        return []
    stale, held = build_leftovers(out)
    if held:
        raise WanTrtError(f"--out {out}: a wan-trt build is writing into it ({held[0].name}); wait for it to finish")
    other = marked_kind(out)
    if other is not None and other != what:  # wan-trt's own files, listed as foreign by this command's rules
        raise WanTrtError(f"--out {out} holds a wan-trt {other}, which {_a(what)} does not replace; pick another "
                          "--out")
    owned = owned_files(out)
    foreign = foreign_files(out, (owned or []) + stale, OUTPUT_KINDS[what])
    if owned is None or foreign:
        shown = ", ".join(foreign[:5]) + (f" and {len(foreign) - 5} more" if len(foreign) > 5 else "")
        why = f"is not a wan-trt {what}" if owned is None else "holds files or folders wan-trt did not write"
        raise WanTrtError(f"--out {out} {why} ({shown}); --overwrite replaces only wan-trt {what}s: pick "
                          "another --out, or move those files away yourself")
    if not overwrite:
        raise WanTrtError(f"--out {out} already holds {_a(what)}; pass --overwrite to replace it")
    return owned + stale


def make_parent(path: Path, flag: str) -> list[Path]:
    """The folder ``path`` goes in, made if missing (where it can be: :func:`check_parent_chain`). Returns the
    folders made, deepest first (for :func:`remove_made`)."""
    real = resolved(path, flag)
    check_parent_chain(real, flag)
    for folder in path.parents:  # a dangling link above: the folder it names would be made, somewhere else
        if folder.is_symlink() and not folder.exists():
            raise WanTrtError(f"{flag} {path}: {folder} is a symbolic link to {os.path.realpath(folder)}, which does "
                              f"not exist; create that folder or pick another {flag}")
    parent = real.parent
    made = []
    try:
        for folder in [*reversed(parent.parents), parent]:  # outermost first; only those this call made are its
            if folder.is_dir():
                continue
            try:
                folder.mkdir()
            except FileExistsError:  # there already, or made meanwhile by another run: not ours to remove
                continue
            made.append(folder)
    except OSError as exc:
        remove_made(made[::-1])
        raise os_error_message(exc, f"creating the folder of {flag} {path}", f"pick another {flag}") or exc
    return made[::-1]


@contextlib.contextmanager
def parent_made(path: Path, flag: str) -> Iterator[None]:
    """The folder ``path`` goes in, made if missing (:func:`make_parent`) for the block: a block that fails removes
    the folders this made, if still empty."""
    made = make_parent(path, flag)
    try:
        yield
    except BaseException:
        remove_made(made)
        raise


def remove_made(folders: list[Path]) -> None:
    """Remove the folders :func:`make_parent` made (deepest first) that are still empty: a refused or failed
    write leaves none of them behind."""
    for folder in folders:
        try:
            folder.rmdir()
        except OSError:  # something is in it now (another output), or it is gone: leave it and those above
            return


@contextlib.contextmanager
def staged_dir(out: Path, owned_files: OwnedFiles, *, overwrite: bool, protect: Sequence[Path] = (),
               what: str = "export") -> Iterator[Path]:
    """Lock ``out``, yield a fresh staging folder, and swap it into place when the block succeeds.

    ``owned_files`` says what in an existing ``out`` wan-trt wrote (:func:`check_out_dir`).

    A failed or interrupted block removes only its own staging folder; the previous export survives.
    OSErrors a user can fix (disk full, permissions) become one WanTrtError naming ``out``.
    """
    out = followed(out)
    with parent_made(out, "--out"), output_lock(out, what):
        old = check_out_dir(out, owned_files, overwrite=overwrite, protect=protect, what=what)  # again, now locked
        _remove_stale_staging(out)
        staging = None
        try:
            staging = Path(tempfile.mkdtemp(prefix=f".{out.name}.partial-", dir=out.parent))
            staging.chmod(0o777 & ~_umask())  # mkdtemp makes it private; the export gets the usual mode
            (staging / MARKER).write_text(marker_text(what))
            yield staging
            _swap_into_place(staging, out, old, what)
        except OSError as exc:
            raise os_error_message(exc, f"writing the {what} --out {out}",
                                   f"free space there or pick another --out; the previous {what}, if any, "
                                   "is unchanged") or exc
        finally:
            if staging is not None and staging.exists():
                shutil.rmtree(staging, ignore_errors=True)


def marker_text(what: str) -> str:
    """The text of the marker file in an output folder of kind ``what`` (one of :data:`OUTPUT_KINDS`)."""
    return MARKER_TEXT.format(what=what)


def marked_kind(folder: Path) -> str | None:
    """The kind of output (``what``: "export", "stream output") the marker file in ``folder`` names, as staged_dir
    writes it (:func:`marker_text`); None without a marker that reads so."""
    try:
        text = (folder / MARKER).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError):
        return None
    head, tail = MARKER_TEXT.split("{what}")
    what = text[len(head):len(text) - len(tail)]
    return what if what and "\n" not in what and text == marker_text(what) else None


def _a(what: str) -> str:
    """``what`` with its indefinite article: 'an export', 'a stream output'."""
    return f"{'an' if what[0] in 'aeiou' else 'a'} {what}"


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def check_input_file(path: str | Path, flag: str) -> None:
    """Refuse an input that is not a regular file, saying what it is (a pipe, such as a shell's ``<(...)``, or
    a folder was reported as no such file)."""
    path = Path(path)
    if path.is_file():
        return
    if not path.exists():
        raise WanTrtError(f"{flag} {path}: no such file")
    kind = "a folder" if path.is_dir() else "a pipe" if stat.S_ISFIFO(path.stat().st_mode) else "not a regular file"
    raise WanTrtError(f"{flag} {path}: {kind}, where a file is read; write it to a file first")


def usual_file_mode() -> int:
    """The mode a plain ``open(.., 'w')`` would give a new file (0o666 less the umask): mkstemp's are private."""
    return 0o666 & ~_umask()


def _remove_stale_staging(out: Path) -> None:
    """Staging folders of killed runs for ``out`` (marked, and nobody else holds the lock); each is named by
    what its marker says it was staging."""
    for stale in out.parent.glob(f".{glob.escape(out.name)}.partial-*"):
        if (stale / MARKER).is_file():
            logger.info("removing %s, left by an interrupted %s", stale, marked_kind(stale) or "wan-trt run")
            shutil.rmtree(stale, ignore_errors=True)


def _swap_into_place(staging: Path, out: Path, old_files: list[Path], what: str) -> None:
    """Rename ``staging`` to ``out``; the old output is moved aside first and then its files removed."""
    aside = None
    if out.exists():
        os.chmod(staging, stat.S_IMODE(out.stat().st_mode))  # the folder's mode stays the user's (a private one)
        aside = out.with_name(f".{out.name}.old-{secrets.token_hex(4)}")
        os.rename(out, aside)
    try:
        os.rename(staging, out)
    except BaseException:  # an interrupt too: the old output goes back where it was, not left hidden aside
        if aside is not None and not out.exists():
            os.rename(aside, out)
        raise
    if aside is not None:
        remove_owned(aside, [aside / p.relative_to(out) for p in old_files], what)


def remove_owned(directory: Path, files: list[Path], what: str = "export") -> None:
    """Delete ``files`` then the folders they leave empty; anything else found, or a file that cannot be
    deleted, is kept and reported (a warning: the new output is in place by then)."""
    failed = []
    for path in files:
        try:
            path.unlink()
        except FileNotFoundError:
            pass
        except OSError as exc:
            failed.append(f"{path.name}: {exc.strerror or exc}")
    for root, _, _ in sorted(os.walk(directory), key=lambda entry: -len(entry[0])):
        with contextlib.suppress(OSError):
            os.rmdir(root)
    if failed:
        logger.warning("could not remove %s, the previous output moved aside (%s); delete it yourself",
                       directory, "; ".join(failed[:3]))
    elif directory.exists():
        logger.warning("kept %s: it holds files the old %s did not have", directory, what)


def check_out_file(path: Path, flag: str, written: Callable[[Path], bool], what: str, *, overwrite: bool) -> None:
    """Refuse a file output that would replace anything but an earlier ``what`` of wan-trt's (``written``
    says which; replaced only with ``overwrite``), a symbolic link (a rename would replace the link, a
    write would change what it points to) or a folder, or that lies where nothing can be written."""
    if path.is_symlink():
        raise WanTrtError(f"{flag} {path} is a symbolic link (to {os.path.realpath(path)}); name the file to write "
                          "itself")
    check_parent_chain(resolved(path, flag), flag)
    if not path.exists():
        return
    if path.is_dir():
        raise WanTrtError(f"{flag} {path} is a folder; name a file")
    if not written(path):
        raise WanTrtError(f"{flag} {path} exists and is not a {what}; pick another {flag} or move that file "
                          "away yourself")
    if not overwrite:
        raise WanTrtError(f"{flag} {path} holds an earlier {what}; pass --overwrite to replace it")


@contextlib.contextmanager
def locked_out_file(path: Path, flag: str, written: Callable[[Path], bool], what: str, *, overwrite: bool,
                    writer: str) -> Iterator[None]:
    """Hold ``path``'s lock while a ``writer`` run writes it, once :func:`check_out_file` allows it under the lock:
    a second run writing the same file fails at once. A run that fails leaves no folder this made, if still empty."""
    with parent_made(path, flag), output_lock(path, writer):
        check_out_file(path, flag, written, what, overwrite=overwrite)
        yield


def write_file(path: Path, data: bytes) -> None:
    """``data`` to ``path`` whole or not at all: a staging file beside it, renamed over it."""
    with staged_file(path) as tmp:
        tmp.write_bytes(data)


@contextlib.contextmanager
def writing(path: Path) -> Iterator[None]:
    """Refuse a write to ``path`` that failed in a way the user can fix (a full disk, no permission) as a
    :class:`WanTrtError` naming ``path`` (not the staging file the error names, which is removed)."""
    try:
        yield
    except OSError as exc:
        error = os_error_message(OSError(exc.errno, exc.strerror), f"writing {path}",
                                 "nothing was written there (free some space, or check the folder's permissions)")
        if error is None:
            raise
        raise error from exc


def staging_file(path: Path) -> Path:
    """A new, empty staging file beside ``path`` (``.<name>.partial-<random>``), for :func:`place_staged`."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.partial-", dir=path.parent)
    os.close(fd)
    return Path(tmp)


def place_staged(staging: Path, path: Path) -> None:
    """Put the written ``staging`` file in place: renamed over ``path``, with the usual mode (mkstemp makes it
    private)."""
    os.chmod(staging, usual_file_mode())
    os.replace(staging, path)


@contextlib.contextmanager
def staged_file(path: Path) -> Iterator[Path]:
    """A staging file beside ``path`` for a writer that takes a file name, renamed over ``path`` once the block
    ends: ``path`` then holds the whole file, or (the writer raised) what it held before, and no staging file is
    left. A write the user can fix is refused as by :func:`writing`."""
    with writing(path):
        tmp = staging_file(path)
        try:
            yield tmp
            place_staged(tmp, path)
        finally:
            tmp.unlink(missing_ok=True)
