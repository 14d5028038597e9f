"""``wan-trt check DIR``: accuracy of an exported pass against PyTorch, single pass and stream.

Single pass (Polygraphy): the fp32 PyTorch model (reference), the PyTorch model in the
graph's precision (the yardstick) and the backend run on the export's sample inputs
through Polygraphy's Comparator; RunResults are saved. Per output the backend passes
when its rel-L2 error against fp32 is at most 2x the yardstick's (floor 1e-3) with no
NaN/Inf, and Polygraphy's ``CompareFunc.simple`` agrees (mean |error| within 2x the
yardstick's mean |error|).

Stream: the backend runs the static-cache session over ``blocks`` blocks (past the
window), then over blocks far into a stream (across latent frame 2**17 = 131072, 5.8 hours
of video at 25 fps, far past both of upstream's RoPE tables), and each
block's latents are compared with the upstream-semantics reference pipeline in fp32; the
yardstick is the PyTorch model in the graph's precision through that same pipeline, so it shares
no code with the runtime under check (a bug of the session would otherwise be in the yardstick too,
and lend the engine twice its own error). A block the session refuses as non-finite is a failing row.
"""
from __future__ import annotations

import contextlib
import dataclasses
import glob
import hashlib
import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator, NamedTuple

import numpy as np
import torch

from wan_trt.decoder_spec import CALLS
from wan_trt.digest import file_identity
from wan_trt.engines.artifact import EngineMetadata, check_unchanged, export_for_engine
from wan_trt.engines.backends import backend_module, get_backend
from wan_trt.engines.backends.torch import TorchRunner
from wan_trt.engines.runtime.arithmetic import fp32_as_fp32
from wan_trt.engines.runtime.cublas_workspace import prefer_workspace_free_gemms
from wan_trt.engines.runtime.runner import Runner
from wan_trt.engines.runtime.finite import NonFiniteBlock
from wan_trt.errors import WanTrtError
from wan_trt.export.decoder import decoder_dirs, read_transformer
from wan_trt.export.manifest import Manifest, reference_models
from wan_trt.log import logger, stage
from wan_trt.outputs import (CHECK_REPORT_KEYS, json_values, json_with_keys, output_lock, place_staged, run_results,
                             staged_by_check, staging_file, write_file, writing, written_by_check)
from wan_trt.precisions import pytorch_precision
from wan_trt.sizes import require_blocks, require_host_room
from wan_trt.spec import COND_CONCAT, LATENTS, GraphSpec, PassSpec
from wan_trt.validate.metrics import ErrorStats, error_stats, passes, rel_l2_floor, tolerance
from wan_trt.stream import synthetic_stream
from wan_trt.validate.stream import compare_stream, reference_stream

RESULTS_DIR = "check"


def report_path(directory: Path, name: str) -> Path:
    """Where the report of the check of ``name`` (an engine file's name, or the runner of an export's graph)
    goes: one file per engine, so that checks of two engines of one export keep their own."""
    return Path(directory) / RESULTS_DIR / f"report_{name}.json"


def engine_report_name(engine: Path, directory: Path) -> str:
    """The name an engine's report and results go by under its export ``directory``: its file's name,
    suffix included, where `wan-trt build` puts engines (the export folder), else that name and a hash of
    its path. Two engines of one file name in two folders, or of one stem in one (``e.pt2`` and ``e.plan``),
    kept one report between them, each check replacing the other's."""
    return _located(engine, directory, Path(engine).resolve().name)


def _located(engine: Path, directory: Path, name: str) -> str:
    """``name`` for ``engine``'s report under ``directory``: as it is for an engine in that folder, else with a hash
    of the engine's path."""
    engine = Path(engine).resolve()
    return name if engine.parent == Path(directory).resolve() else \
        f"{name}-{hashlib.sha256(str(engine).encode()).hexdigest()[:8]}"


def former_report_name(engine: Path, directory: Path, prefix: str = "") -> str | None:
    """The name an earlier check of ``engine`` left its report and RunResults under before they kept the engine's
    suffix (``<prefix><stem>``), if its report there is a check's of this very engine: those files would stay
    beside the new ones, looking current (:func:`clear_report` removes them). None otherwise."""
    resolved = Path(engine).resolve()
    name = prefix + _located(resolved, directory, resolved.stem)
    old = report_path(directory, name)
    report = json_with_keys(old, CHECK_REPORT_KEYS) if old.is_file() and not old.is_symlink() else None
    return name if report is not None and report.get("target") == str(resolved) else None


def results_path(directory: Path, name: str) -> Path:
    """Where the Polygraphy RunResults of the check of ``name`` go (see :func:`report_path`)."""
    return Path(directory) / RESULTS_DIR / f"run_results_{name}.json"


def clear_report(*paths: Path) -> None:
    """Remove the report (and RunResults) an earlier check of the same target left, before this one runs: a
    check that stops half-way, or saves no RunResults, leaves none of the earlier check's beside its own; and
    the staging files of those a kill stopped. A file under a report's name that no check wrote is refused,
    not removed."""
    for path in paths:
        ours = written_by_check if path.name.startswith("report_") else run_results
        if path.is_file() and not ours(path):
            kind = "check report" if ours is written_by_check else "check's RunResults"
            raise WanTrtError(f"{path} is not a wan-trt {kind}, and this check writes its file there; move it away "
                              "and check again")
    for path in paths:
        if path.is_file():
            path.unlink()
            logger.info("%s: the earlier check's file removed (this check writes its own)", path)
        for staging in path.parent.glob(f".{glob.escape(path.name)}.partial-*"):  # a killed check's (gigabytes)
            if staged_by_check(staging):
                staging.unlink(missing_ok=True)
                logger.info("%s: removed, left by a check of the same target that was killed", staging)


def clear_checks_of(engine: Path, export: Path) -> None:
    """Remove the reports (and their RunResults) of earlier checks that ran ``engine``, built from ``export`` (their
    target, or an engine they ran, is its path): a build replacing the engine calls it, as no check ran the new
    file. A rebuilt engine's path kept its old report, saying ok: true. Reports of the export's other targets stay."""
    dirs = decoder_dirs(export.parent) if export.name in CALLS else None  # a decoder's report is in steady/
    directories = list(dirs.values()) if dirs else [export]
    path = str(Path(engine).resolve())
    for directory in directories:
        for report in sorted((directory / RESULTS_DIR).glob("report_*.json")):
            data = json_with_keys(report, CHECK_REPORT_KEYS) if not report.is_symlink() else None
            if data is None or path not in _paths_run(data):
                continue
            name = report.name.removeprefix("report_").removesuffix(".json")
            for results in (results_path(d, name) for d in directories):
                if run_results(results):
                    results.unlink()
            report.unlink()
            logger.info("%s: removed, the report of the engine this build replaces", report)


def _paths_run(report: dict[str, Any]) -> list[Any]:
    """The files a check ``report`` (as read) names as checked: its target, and a decoder's two engines."""
    engines = report.get("engines")
    pair = [e.get("path") for e in engines.values() if isinstance(e, dict)] if isinstance(engines, dict) else []
    return [report.get("target"), *pair]


@contextlib.contextmanager
def report_locked(path: Path) -> Iterator[None]:
    """Hold the lock of the report ``path`` for a whole check: one check of a target at a time. A second, started
    while the first ran, removed the first's staged RunResults as a killed check's (the first then failed at its
    end, its report lost) and wrote its own report in its place."""
    if path.parent.exists() and not path.parent.is_dir():
        raise WanTrtError(f"{path.parent} is a file, not the folder the check writes its reports in; move it away and "
                          "check again")
    with writing(path):
        path.parent.mkdir(parents=True, exist_ok=True)
    with output_lock(path, "check", "wait for it to finish: one check of a target runs at a time"):
        yield


def report_json(report: "CheckReport") -> str:
    """The report as strict JSON (no NaN or Infinity), with the command, machine and code that made it: what
    ``check --json`` prints and the report file holds."""
    from wan_trt.profiling import provenance
    return json.dumps({**provenance("wan-trt", report.device or None), **report.as_dict()}, indent=2, allow_nan=False)


def write_report(path: Path, report: "CheckReport") -> None:
    """The report's file (:func:`report_json`), written whole or not at all."""
    write_file(path, report_json(report).encode())


@dataclass
class OutputCheck:
    name: str
    stats: ErrorStats
    yardstick: ErrorStats
    allowed_rel_l2: float
    polygraphy_ok: bool

    @property
    def ok(self) -> bool:
        return passes(self.stats, self.allowed_rel_l2) and self.polygraphy_ok


@dataclass
class CheckReport:
    """What a check found. ``target``: the export directory or engine file checked (``engine_sha256``: the
    engine's, as verified before it ran; ``engines``: every engine file that ran, by graph, each ``{path,
    sha256}``, where a check runs more than one: a decoder's two), ``device`` and ``options``: how it ran;
    ``notes``: what the numbers do not cover (e.g. plugin nodes run as reference functions), in the report and its
    table; ``manifests``: each export folder whose graph ran, with the sha256 of its manifest.json as read (which
    records every file's digest: an export's report names the exact graph and inputs it judged)."""

    backend: str
    precision: str
    outputs: list[OutputCheck] = field(default_factory=list)
    stream: list[dict[str, Any]] = field(default_factory=list)
    target: str = ""
    engine_sha256: str | None = None
    device: str = ""
    options: dict[str, Any] = field(default_factory=dict)
    engines: dict[str, dict[str, str | None]] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    manifests: dict[str, str | None] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return all(o.ok for o in self.outputs) and all(b["ok"] for b in self.stream)

    def as_dict(self) -> dict[str, Any]:
        """The report as JSON values: a non-finite number is null (its row's ``non_finite`` counts say why), as
        strict JSON has no NaN or Infinity."""
        return json_values({
            "backend": self.backend, "precision": self.precision, "ok": self.ok, "target": self.target,
            "engine_sha256": self.engine_sha256, **({"engines": self.engines} if self.engines else {}),
            "manifests": self.manifests,
            "device": self.device, "options": self.options,
            "single_pass": [{"output": o.name, **o.stats.as_dict(), "yardstick_rel_l2": o.yardstick.rel_l2,
                             "allowed_rel_l2": o.allowed_rel_l2, "polygraphy_ok": o.polygraphy_ok, "ok": o.ok}
                            for o in self.outputs],
            "stream": self.stream, **({"notes": self.notes} if self.notes else {})})

    def problems(self) -> list[str]:
        """One line per failing output or block, saying what to do where we know."""
        lines = []
        for o in self.outputs:
            if not o.ok:
                within = passes(o.stats, o.allowed_rel_l2)
                parts = [f"rel-L2 {o.stats.rel_l2:.3e} {'within' if within else '>'} allowed {o.allowed_rel_l2:.3e}"]
                if o.stats.non_finite:
                    parts.append(f"{o.stats.non_finite} NaN/Inf")
                if not o.polygraphy_ok:
                    parts.append("Polygraphy's comparison failed (shape, dtype or mean error)")
                lines.append(f"{o.name}: " + ", ".join(parts) + _no_allowance(o.yardstick, self.precision))
        lines += [f"stream block {b['block']}: " + (b["error"] if "error" in b else
                                                     f"rel-L2 {b['rel_l2']:.3e} > allowed {b['allowed_rel_l2']:.3e}"
                                                     + _stream_no_allowance(b))
                  for b in self.stream if not b["ok"]]
        non_finite = any(o.stats.non_finite for o in self.outputs) or any(b["non_finite"] for b in self.stream)
        if self.precision == "fp16" and non_finite:
            lines.append("the fp16 graph overflows (NaN/Inf): this model does not run in fp16; use --precision bf16")
        return lines

    def table(self) -> str:
        rows = [f"{'output':16} {'max abs':>10} {'mean abs':>10} {'rel-L2':>10} {'allowed':>10} {'cosine':>10} "
                f"{'NaN/Inf':>8}  result"]
        for o in self.outputs:
            s = o.stats
            rows.append(f"{o.name:16} {s.max_abs:10.3e} {s.mean_abs:10.3e} {s.rel_l2:10.3e} {o.allowed_rel_l2:10.3e} "
                        f"{s.cosine:10.6f} {s.non_finite:8d}  {'ok' if o.ok else 'FAIL'}")
        for b in self.stream:
            rows.append(f"{'block ' + str(b['block']):16} {b['max_abs']:10.3e} {b['mean_abs']:10.3e} "
                        f"{b['rel_l2']:10.3e} {b['allowed_rel_l2']:10.3e} {b['cosine']:10.6f} {b['non_finite']:8d}  "
                        f"{'ok' if b['ok'] else 'FAIL'}")
        if self.options.get("stream") is False:  # a passed check of the single pass only says so
            rows.append(f"{'stream':16} not run (--no-stream)")
        rows += [f"note: {n}" for n in self.notes]
        return "\n".join(rows)


def _no_allowance(yardstick: ErrorStats, precision: str) -> str:
    """Why an output had no allowance to be judged by, if so."""
    if yardstick.reference_non_finite:
        return (f"; the fp32 PyTorch reference itself gives {yardstick.reference_non_finite} NaN/Inf: nothing to "
                "compare with")
    if yardstick.non_finite:
        return (f"; the yardstick (the PyTorch {pytorch_precision(precision)} model) itself gives "
                f"{yardstick.non_finite} NaN/Inf: no allowance")
    return ""


def _stream_no_allowance(row: dict[str, Any]) -> str:
    if row.get("reference_non_finite"):
        return "; the fp32 reference itself gives NaN/Inf"
    if not math.isfinite(row["yardstick_rel_l2"]):
        return "; the yardstick's stream (the PyTorch model in this precision) gives NaN/Inf: no allowance"
    return ""


def require_polygraphy() -> None:
    """The single-pass check runs Polygraphy's Comparator: a clear error where it is missing."""
    try:
        import polygraphy  # noqa: F401
    except ImportError as exc:
        raise WanTrtError("the accuracy check compares through Polygraphy, which is not installed: "
                          "pip install 'polygraphy>=0.49'") from exc


def check_single_pass(backend, reference: Runner, yardstick: Runner, feeds: dict[str, torch.Tensor],
                      feed_spec: GraphSpec, save_to: StagedResults | None = None,
                      judged: list[str] | None = None) -> list[OutputCheck]:
    """Polygraphy Comparator over the three runners on one feed dict.

    ``backend`` is a wan-trt Runner or a native Polygraphy runner (e.g. TensorRT's ``TrtRunner``);
    the caller has made sure Polygraphy is installed. ``save_to``: where to save the RunResults (a staging file
    of :func:`results_staged`), or None. ``judged``: the outputs compared (default: all).
    """
    # deferred: Polygraphy is optional until a check runs (require_polygraphy says what to install)
    from polygraphy.backend.base import BaseRunner
    from polygraphy.comparator import Comparator
    from polygraphy.logger import G_LOGGER

    from wan_trt.validate.polygraphy_runner import FloatOutputs, PolygraphyAdapter

    names = judged or feed_spec.output_names
    runners = [PolygraphyAdapter(r, feed_spec, names) for r in (reference, yardstick)]
    runners.append(FloatOutputs(backend) if isinstance(backend, BaseRunner) else
                   PolygraphyAdapter(backend, feed_spec, names))
    with G_LOGGER.verbosity(G_LOGGER.ERROR):
        results = Comparator.run(runners, data_loader=[feeds])
    if save_to is not None:
        with writing(save_to.path), G_LOGGER.verbosity(G_LOGGER.ERROR):  # Polygraphy announces saves on
            results.save(str(save_to.staging))                            # stdout; we log them
    (_, ref_out), (_, yard_out), (_, back_out) = [(name, iters[0]) for name, iters in results.items()]
    _require_spec_shapes(runners[-1].name, back_out, feed_spec, names)
    yard = {n: error_stats(yard_out[n], ref_out[n]) for n in names}
    # mean |error| within 2x the larger of the yardstick's and the precision's floor (floor x the mean |reference|):
    # Polygraphy's own verdict beside the rel-L2 policy, which is the stricter where the floor rules
    floor = rel_l2_floor(feed_spec.precision)
    atol = {n: 2 * max(yard[n].mean_abs, floor * float(np.abs(ref_out[n]).mean())) for n in names}
    compare = _simple_compare(atol=atol, rtol={n: 0.0 for n in names}, check_error_stat="mean")
    with G_LOGGER.verbosity(G_LOGGER.ERROR):
        accuracy = Comparator.compare_accuracy(results, comparisons=[(0, 2)], compare_func=compare)
    (pair_results,) = accuracy[0].values()  # one comparison function, one runner pair
    poly = pair_results[0]  # first (only) iteration
    allowed = {n: tolerance(yard[n].rel_l2, feed_spec.precision) for n in names}
    return [OutputCheck(n, error_stats(back_out[n], ref_out[n]), yard[n], allowed[n], bool(poly[n])) for n in names]


def _require_spec_shapes(backend: str, outputs: dict[str, np.ndarray], spec: GraphSpec, names: list[str]) -> None:
    """Refuse a backend whose output ``names`` are not of ``spec``'s shapes: it does not compute the graph, and no
    statistic of, say, a transposed output means anything (the check died in them with a traceback)."""
    for n in names:
        if list(outputs[n].shape) != list(spec.tensor(n).shape):
            raise WanTrtError(f"{backend}'s output {n} has shape {list(outputs[n].shape)}, its spec's is "
                              f"{list(spec.tensor(n).shape)}: it does not compute the graph it was made for, so "
                              "nothing of it can be judged; rebuild the engine (or re-export the graph)")


def _simple_compare(**kwargs):
    """Polygraphy's simple compare function (SimpleCompareFunc from 0.53, CompareFunc.simple before)."""
    try:
        from polygraphy.comparator import SimpleCompareFunc
        return SimpleCompareFunc(**kwargs)
    except ImportError:
        from polygraphy.comparator import CompareFunc
        return CompareFunc.simple(**kwargs)


# Blocks streamed far into a stream besides the first ones, so that a position-dependent bug
# shows too, not only the first few frames. Positions enter only as rotary factors and a rotary
# score depends only on position differences, so what can break far out is a table, a counter or
# a precision that wraps or rounds: the deep blocks cross 2**17 frames (a power of two, where
# fixed-width tables and counters wrap), far past both of upstream's tables (1024 and 7500 frames).
DEEP_BLOCKS = 4
DEEP_CROSSING = 1 << 17


def deep_start_block(block_frames: int) -> int:
    """The first deep block: the :data:`DEEP_BLOCKS` blocks cross :data:`DEEP_CROSSING` (43688 for 3 frames)."""
    return DEEP_CROSSING // block_frames - DEEP_BLOCKS // 2


def require_blocks_fit(blocks: int, spec: GraphSpec, given: str, made: str) -> None:
    """Refuse, before any work, a stream check of ``blocks`` blocks (an int >= 1) that this machine's memory could
    not hold: it keeps every block's ``given`` input and its three ``made`` outputs (reference, yardstick,
    backend) until it compares them, in fp32 (``spec``: the graph's, naming them). --blocks 100000000000 built the
    references, then died in the allocator with a traceback."""
    require_blocks(blocks)
    block_bytes = 4 * (math.prod(spec.tensor(given).shape) + 3 * math.prod(spec.tensor(made).shape))
    require_host_room(blocks, blocks * block_bytes, f"the stream check holds every block's {given} and its three "
                      f"streams' {made} (reference, yardstick, backend)",
                      f"pass fewer blocks (the default is {DEFAULT_BLOCKS[spec.KIND]})")


def check_stream(backend: Runner, reference_model, yardstick_model, blocks: int, seed: int) -> list[dict]:
    """Per-block errors of the backend's stream vs the fp32 upstream-semantics pipeline; ``yardstick_model``:
    the PyTorch model in the graph's precision, run through the same pipeline.

    Two streams: ``blocks`` blocks from block 0, then :data:`DEEP_BLOCKS` blocks from
    :func:`deep_start_block` (started there with empty caches, as a stream can be).
    """
    rows = _stream_rows(backend, reference_model, yardstick_model, blocks, seed, 0)
    deep = deep_start_block(backend.spec.config.block_frames)
    return rows + _stream_rows(backend, reference_model, yardstick_model, DEEP_BLOCKS, seed, deep)


def _stream_rows(backend: Runner, reference_model, yardstick_model, blocks: int, seed: int,
                 start_block: int) -> list[dict]:
    """Rows of one stream; a block of the backend refused as non-finite ends the stream with a failing row. A
    yardstick block that came out non-finite lends no allowance: the backend's row fails, saying so (not blamed
    on the backend)."""
    frames = backend.spec.config.block_frames
    inputs = synthetic_stream(backend.spec.config, blocks, seed, first_block=start_block)
    expected = reference_stream(reference_model, inputs, blocks, seed, start_block=start_block)
    yard = expected if yardstick_model is reference_model else \
        reference_stream(yardstick_model, inputs, blocks, seed, start_block=start_block)  # fp32: the reference
    base = [error_stats(y, e) for y, e in zip(yard, expected)]
    try:
        got = compare_stream(reference_model, backend, blocks, seed, inputs, start_block=start_block,
                             expected=expected)
    except NonFiniteBlock as exc:
        nan = float("nan")
        return [{"block": exc.block, "start_frame": exc.block * frames, "max_abs": nan, "mean_abs": nan,
                 "rel_l2": float("inf"), "cosine": nan, "non_finite": 1, "yardstick_rel_l2": nan,
                 "allowed_rel_l2": nan, "seconds": nan, "ok": False, "error": str(exc)}]
    rows = []
    for i, (b, y) in enumerate(zip(got.blocks, base)):
        block = start_block + i
        y_rel_l2 = float("nan") if y.non_finite else y.rel_l2
        allowed = tolerance(y_rel_l2, backend.spec.precision)
        row = {"block": block, "start_frame": block * frames, **b.as_dict(), "yardstick_rel_l2": y_rel_l2,
               "allowed_rel_l2": allowed, "seconds": got.block_seconds[i], "ok": passes(b, allowed)}
        if y.non_finite:
            row["error"] = (f"the yardstick's stream (the PyTorch model in this precision) came out non-finite at "
                            f"block {block}: no allowance")
        rows.append(row)
    return rows


@dataclass(frozen=True)
class CheckOptions:
    """What `wan-trt check` was asked for, beside the target.

    Attributes:
        provider: ONNX Runtime execution provider for an export directory ('cpu' or 'cuda'; None where the
            target is an engine, which runs on the device it was built for).
        blocks: blocks of the multi-block stream check; None: the graph's default (:data:`DEFAULT_BLOCKS`), or
            no stream check in the options as run (:meth:`as_run`).
        seed: seed of the stream's inputs and noise; None in the options as run without a stream check.
        stream: run the stream check.
        save_results: save Polygraphy's RunResults under check/.
    """

    provider: str | None = "cpu"
    blocks: int | None = None
    seed: int | None = 0
    stream: bool = True
    save_results: bool = True

    def as_run(self, kind: str) -> "CheckOptions":
        """These options as a check of graph kind ``kind`` (a spec's KIND) runs them, as its report records them:
        ``blocks`` as given, else the kind's default; without the stream check, no ``blocks`` nor ``seed`` (None:
        they set the stream only)."""
        if not self.stream:
            return dataclasses.replace(self, blocks=None, seed=None)
        return self if self.blocks is not None else dataclasses.replace(self, blocks=DEFAULT_BLOCKS[kind])


# the stream check's blocks by default, by graph kind: the DiT pass's 8 cross two windows; the decoder's reference is
# the whole clip decoded at once, whose fp32 activations at full size fill most of an 80 GB GPU at 3 blocks
DEFAULT_BLOCKS = {"pass": 8, "decoder": 3, "tiny-decoder": 3}


def folder_identities(*directories: Path) -> dict[Path, tuple[int, int] | None]:
    """(device, inode) of each folder: `export --overwrite` swaps a new folder in under the same path. A check
    takes them before it reads a manifest, so that what it reads and what it vouches for are of one folder; and
    of an engine file, which a build replaces the same way."""
    return {d: _folder_identity(d) for d in directories}


def _folder_identity(directory: Path) -> tuple[int, int] | None:
    """(device, inode) of ``directory``; None where nothing is there (read as replaced, if it was there)."""
    try:
        st = directory.stat()
    except FileNotFoundError:  # the caller's read of its manifest says what is missing
        return None
    return st.st_dev, st.st_ino


def require_unreplaced(identities: dict[Path, tuple[int, int] | None], checked: str) -> None:
    """Refuse to write a report when a folder the check read was replaced while it ran (``checked``: what was
    checked): the report would vouch for files the check never ran."""
    _refuse_replaced([d for d, identity in identities.items() if folder_identities(d)[d] != identity], checked)


def identities_of_read(manifests: dict[Path, Manifest], checked: str) -> dict[Path, tuple[int, int] | None]:
    """:func:`folder_identities` of export folders whose manifests (``manifests``, by folder) were read and
    verified before the folders were known (an engine's export is found by its manifest's hash): refused as
    replaced where a folder's manifest.json is no longer the one read. The same manifest holds the same files'
    hashes, so a folder swapped in before this, with another manifest, is caught."""
    identity = folder_identities(*manifests)
    _refuse_replaced([d for d, m in manifests.items() if Manifest.digest_at(d) != m.sha256], checked)
    return identity


def _refuse_replaced(replaced: list[Path], checked: str) -> None:
    folders = [Path(p).resolve() for p in replaced]  # an engine inside a replaced folder goes without saying
    replaced = [p for p in replaced if not any(f in Path(p).resolve().parents for f in folders)]
    if replaced:
        raise WanTrtError(f"{', '.join(map(str, replaced))} {'was' if len(replaced) == 1 else 'were'} replaced while "
                          f"{checked} was checked (by an `export --overwrite` or a build?): this check's numbers are "
                          "not those of what is there now, so no report was written; check it again")


class StagedResults(NamedTuple):
    """Where a check saves its RunResults (``staging``) and where they go once it passed its end (``path``)."""

    staging: Path
    path: Path


@contextlib.contextmanager
def results_staged(results: dict[str, Path], identity: dict[Path, tuple[int, int] | None], checked: str
                   ) -> Iterator[dict[str, StagedResults]]:
    """Staging files for a check's RunResults, by the keys of ``results`` (where they go; empty where none are
    saved), each renamed there whole (RunResults of a full-size pass are ~4 GB) only once the check's work is
    done and its folders are found unreplaced (:func:`require_unreplaced`, ``checked`` as there). A check that
    fails or finds a folder replaced leaves none: they would be the results of a graph that is not there. A check
    that fails with a folder replaced meanwhile (a graph file its runner went to read gone with the old folder)
    is refused as replaced, the failure chained."""
    staged: dict[str, StagedResults] = {}
    try:
        for key, path in results.items():
            with writing(path):
                staged[key] = StagedResults(staging_file(path), path)
        try:
            yield staged
        except Exception as failure:
            try:
                require_unreplaced(identity, checked)
            except WanTrtError as replaced:
                raise replaced from failure
            except OSError:  # the folders cannot be looked at (permissions): the check's own failure is the news
                pass
            raise
        require_unreplaced(identity, checked)
        for s in staged.values():
            with writing(s.path):
                try:
                    place_staged(s.staging, s.path)
                except FileNotFoundError:  # the staging file's folder is gone: replaced since the line above
                    require_unreplaced(identity, checked)
                    raise
            logger.info("Polygraphy RunResults saved to %s", s.path)
    finally:
        for s in staged.values():
            s.staging.unlink(missing_ok=True)


@fp32_as_fp32()
def check_runner(directory: Path, manifest: Manifest, backend: Runner, options: CheckOptions, *,
                 single_pass_backend=None, target: Path | None = None, engine_sha256: str | None = None,
                 identity: dict[Path, tuple[int, int] | None] | None = None, notes: list[str] = ()) -> CheckReport:
    """Single pass (Polygraphy) and stream checks of ``backend`` against the PyTorch references.

    ``single_pass_backend`` replaces ``backend`` in the Polygraphy comparison (TensorRT's own
    ``TrtRunner``); the stream always runs ``backend`` in the static-cache session. ``target``: the engine
    file ``backend`` runs (``engine_sha256``: its verified hash), or None for the export's graph; the
    report goes to :func:`report_path`, named after it. ``identity``: :func:`folder_identities` of
    ``directory`` taken before ``manifest`` was read (defaults to taking it here). ``notes``: the report's
    (:class:`CheckReport`).
    """
    require_polygraphy()  # before minutes of reference building
    identity = identity if identity is not None else folder_identities(directory)
    spec = manifest.spec
    o = options.as_run(spec.KIND)
    if o.stream:
        require_blocks_fit(o.blocks, spec, COND_CONCAT, LATENTS)
    device = str(backend.device)
    name = engine_report_name(target, directory) if target is not None else backend.name
    path, results = report_path(directory, name), results_path(directory, name)
    former = former_report_name(target, directory) if target is not None else None
    with report_locked(path):
        clear_report(path, results, *((report_path(directory, former), results_path(directory, former)) if former
                                      else ()))
        with stage("rebuild the PyTorch references"):
            low, fp32 = reference_models(manifest, device)
        report = CheckReport(backend.name, spec.precision, target=str(Path(target or directory).resolve()),
                             engine_sha256=engine_sha256, device=device, options=dataclasses.asdict(o),
                             notes=list(notes), manifests={str(Path(directory).resolve()): manifest.sha256})
        reference = TorchRunner(fp32, PassSpec.from_config(spec.config, "fp32"))
        reference.name = "torch-fp32"
        yardstick = TorchRunner(low, spec)
        yardstick.name = f"torch-{pytorch_precision(spec.precision)}"
        with results_staged({name: results} if o.save_results else {}, identity, "it") as staging:
            with stage("single pass (Polygraphy Comparator)"):
                report.outputs = check_single_pass(single_pass_backend or backend, reference, yardstick,
                                                   manifest.sample_feeds(directory), spec, staging.get(name))
            if o.stream:
                with stage(f"stream of {o.blocks} blocks vs the upstream-semantics pipeline"):
                    report.stream = check_stream(backend, fp32, low, o.blocks, o.seed)
        write_report(path, report)
        logger.info("check %s: %s%s (report: %s)", backend.name, "passed" if report.ok else "FAILED",
                    "" if o.stream else " the single pass; stream check not run (--no-stream)", path)
        for note in report.notes:
            logger.info("note: %s", note)
    return report


REFERENCE_PLUGINS = ("the graph's wan_trt plugin nodes ran as wan-trt's PyTorch reference functions of the fused ops "
                     "(onnxruntime-extensions): this checks the graph's wiring of them, not their kernels (a check of "
                     "an engine built with --ops plugins runs those)")


def check_export(directory: str | Path, options: CheckOptions = CheckOptions()) -> CheckReport:
    """Check an export directory's graph with ONNX Runtime (``options.provider``) against PyTorch.

    The manifest and the size + sha256 of every file it names are verified before any parse.
    """
    directory = Path(directory)
    identity = folder_identities(directory)  # before the manifest is read: a report is of the folder read
    # verifies the graph, external data and sample inputs; refuses a decoder export's graph by name
    manifest = read_transformer(directory, "check")
    onnxruntime = backend_module(get_backend("onnxruntime"))
    backend, single_pass = onnxruntime.check_runners(directory, manifest, options.provider)
    notes = [REFERENCE_PLUGINS] if manifest.ops == "plugins" else []
    return check_runner(directory, manifest, backend, options, single_pass_backend=single_pass, identity=identity,
                        notes=notes)


def verified_runners(engine: Path, meta: EngineMetadata, manifest: Manifest) -> tuple[Runner, Any]:
    """The check's runners of ``engine`` (its backend's ``check_runners``), the file verified against ``meta``
    first, before any deserialization: the report gives that sha256. Refused if the file was replaced before the
    runners took it (their own verification reads the metadata again): a build installing another engine meanwhile
    had it run, and pass, under the sha256 of the one it replaced."""
    verified = file_identity(engine)
    meta.check_against(manifest, engine)
    runners = backend_module(get_backend(meta.backend)).check_runners(engine, manifest)
    check_unchanged(engine, verified)
    return runners


def check_engine(engine: str | Path, options: CheckOptions = CheckOptions()) -> CheckReport:
    """Check a built engine (any registered backend that builds one) against PyTorch.

    The export checked against is the one the engine was built from (found by the manifest hash its
    metadata records, and logged); the engine file must have the size and sha256 recorded at build.
    """
    prefer_workspace_free_gemms()  # before any GEMM: the engine runs as the runtime runs it
    engine = Path(engine)
    meta = EngineMetadata.read(engine)
    directory, manifest = export_for_engine(engine, meta)
    # before the engine is verified and loaded: its export folder and the engine file itself (a build renames a new
    # one over it) must be those read when the report is written
    identity = {**identities_of_read({directory: manifest}, "it"), **folder_identities(engine)}
    require_polygraphy()
    backend, single_pass = verified_runners(engine, meta, manifest)
    return check_runner(directory, manifest, backend, options, single_pass_backend=single_pass, target=engine,
                        engine_sha256=meta.engine_file.get("sha256"), identity=identity)
