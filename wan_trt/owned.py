"""What wan-trt wrote: the files of its output folders (an export, a stream output) and its bench reports,
told from a user's by their names and content. The standard library only (with :mod:`wan_trt.outputs`), so
that `make clean` runs it without an environment:

    python3 -m wan_trt.owned clean PATH...   # each folder: remove what wan-trt wrote, keep the rest;
                                             # each file: remove it if it is a bench report
"""
from __future__ import annotations

import json
import os
import sys
from pathlib import Path

from wan_trt.errors import WanTrtError
from wan_trt.outputs import (MARKER, OUTPUT_KINDS, build_leftovers, check_files_in, engine_files_in, foreign_files,
                             json_with_keys, marked_kind, output_lock)

MANIFEST = "manifest.json"
GRAPH = "model.onnx"
SAMPLE_INPUTS = "sample_inputs.safetensors"
FORMAT = "wan-trt-export/1"  # the manifest's "format"
STREAM_FILES = ("latents.pt", "video.mp4", "report.json")  # what a stream's --out gets
STREAM_REPORT_KEYS = {"config", "precision", "device", "block_ms", "summary"}
BENCH_REPORT_KEYS = {"command", "environment", "backends", "skipped", "failed"}  # in every bench results file


def recorded_files(path: Path) -> list[str] | None:
    """The file names a wan-trt manifest at ``path`` lists (also a damaged or older one); None if it is
    missing or not a wan-trt manifest. Used to recognise an export before replacing it."""
    try:
        data = json.loads(path.read_bytes().decode("utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        return None
    legacy = {"spec", "fingerprint", "weights", "sample_inputs"}
    if not isinstance(data, dict) or not (data.get("format") == FORMAT or legacy <= set(data)):
        return None
    names = [data.get(k) for k in ("graph", "external_data", "sample_inputs")]
    return [n for n in names if isinstance(n, str) and Path(n).name == n and n not in ("", ".", "..")]


def owned_export_files(directory: Path) -> list[Path] | None:
    """Every file wan-trt wrote into the export ``directory``, or None if it is not a wan-trt export."""
    names = recorded_files(directory / MANIFEST)
    if names is None and not (directory / MARKER).is_file():
        return None
    names = names if names is not None else [GRAPH, GRAPH + ".data", SAMPLE_INPUTS]
    owned = [directory / n for n in [MARKER, MANIFEST, *names]]
    owned += check_files_in(directory)
    return [p for p in owned if p.is_file()] + engine_files_in(directory)


def owned_stream_files(directory: Path) -> list[Path] | None:
    """The files `wan-trt stream` wrote into ``directory``, or None if it is not a stream output: its
    report.json, and its marker file (a folder an older wan-trt wrote has none: then it must hold nothing
    but the stream's own files). Its video.mp4 only if the report counts the video's frames: a stream run
    with --no-video wrote none, so a video there is someone else's."""
    report = json_with_keys(directory / "report.json", STREAM_REPORT_KEYS)
    if report is None:
        return None
    if not (directory / MARKER).is_file() and not {p.name for p in directory.iterdir()} <= set(STREAM_FILES):
        return None
    summary = report["summary"]
    names = [n for n in STREAM_FILES if n != "video.mp4" or (isinstance(summary, dict) and "video_frames" in summary)]
    return [p for p in (directory / n for n in (MARKER, *names)) if p.is_file() and not p.is_symlink()]


OWNED_FILES = {"export": owned_export_files, "stream output": owned_stream_files}  # by OUTPUT_KINDS' kind


def is_bench_report(path: Path) -> bool:
    """Whether ``path`` is a results file `wan-trt bench` wrote."""
    return json_with_keys(path, BENCH_REPORT_KEYS) is not None


def clean(path: Path) -> str:
    """Remove what wan-trt wrote at ``path`` and nothing else; returns what was done, in a line.

    A folder marked as a wan-trt output loses the files its kind's rules call wan-trt's (those an
    `--overwrite` would replace) and the folders they leave empty; a user's files in it stay, and so does
    the folder then. A file goes if it is a bench report. Anything else is left as it is."""
    if path.is_symlink() or not path.exists():
        return f"{path}: {'a symbolic link, left as it is' if path.is_symlink() else 'not there'}"
    if path.is_file():
        if not is_bench_report(path):
            return f"{path}: not a wan-trt bench report, kept"
        path.unlink()
        return f"{path}: removed"
    kind = marked_kind(path)
    if kind not in OWNED_FILES:
        return f"{path}: not a wan-trt output folder, kept"
    with output_lock(path, "run", "wait for it to finish"):
        stale, held = build_leftovers(path)
        if held:
            raise WanTrtError(f"{path}: a wan-trt build is writing into it ({held[0].name}); wait for it to finish")
        real = path.resolve()
        # a file reached through a linked folder (check/ a link to the user's) lies outside: not this output's
        owned = [f for f in (OWNED_FILES[kind](path) or []) + stale
                 if f.parent.resolve() == real / f.parent.relative_to(path)]
        kept = foreign_files(path, owned, OUTPUT_KINDS[kind])
        empty_before = {Path(root) for root, dirs, files in os.walk(path) if not dirs and not files}  # the user's
        for file in owned:
            if not file.is_symlink():  # a link named as one of wan-trt's files is the user's (foreign_files: kept)
                file.unlink(missing_ok=True)
        for root, _, _ in sorted(os.walk(path), key=lambda entry: -len(entry[0])):
            if Path(root) not in empty_before or Path(root).relative_to(path) in OUTPUT_KINDS[kind]:
                try:  # a folder wan-trt's files alone filled (or wan-trt's own, as an export's check/)
                    os.rmdir(root)
                except OSError:
                    pass  # it holds the user's files
    if not kept:
        return f"{path}: removed"
    shown = ", ".join(kept[:5]) + (f" and {len(kept) - 5} more" if len(kept) > 5 else "")
    return f"{path}: removed wan-trt's {kind} files, kept what it did not write ({shown})"


def main(argv: list[str]) -> int:
    if len(argv) < 2 or argv[0] != "clean":
        print("usage: python3 -m wan_trt.owned clean PATH...", file=sys.stderr)
        return 2
    status = 0
    for arg in argv[1:]:
        try:
            print(clean(Path(arg)))
        except (WanTrtError, OSError) as exc:
            print(f"{arg}: {exc}; nothing more removed there", file=sys.stderr)
            status = 1
    return status


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
