"""``wan-trt bench``: every backend available here, side by side, streaming the same blocks.

Backends: the registry, :mod:`wan_trt.engines.backends`.

Without ``backends`` every backend runs, and those this machine cannot run (no CUDA device,
no TensorRT, no engine file given, ...) are skipped with the reason. Backends named explicitly
must run: an unknown name is refused before any work, and a named backend that cannot run is a
failure (the command exits non-zero; the others' results are still written). A backend that
raises is a failure with its traceback in the report, and so is a decoder row (``decoder <row>``).

Per backend: ms per pass, ms per block (steady state: blocks after the first), P50/P95,
video frames per second (a steady block's frames: 12 for 3 latent frames), TFLOP/s and the fraction
of the dense bf16 peak (:mod:`wan_trt.engines.flops`; from the P50 block), and peak device memory
(with what the process already held when the row began: ``start_torch_mem_gib``).

Engines of other exports of the same config (``also_engines``: e.g. the fp16 and fp8 builds beside
the bf16 export's rows) run in the same process, each on its own export's inputs, their rows named
``<backend>@<precision>``; ``--profile`` takes those names too.
"""
from __future__ import annotations

import contextlib
import importlib.util
import io
import json
import statistics
import struct
import time
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any

import torch

from wan_trt.config import WanConfig
from wan_trt.engines.artifact import EngineMetadata, export_for_engine
from wan_trt.engines.backends import (ALL_BACKENDS, BACKENDS, ENGINE_FLAGS, RunnerSources, Unavailable, get_backend,
                                     make_runner, missing_engine, parse_backends)
from wan_trt.engines.backends.aoti import check_fp8_device
from wan_trt.engines.bench_decoder import (DECODER_PROFILE, DECODER_WARMUP_BLOCKS, bench_decoder, check_decoder_request,
                                           engine_variants)
from wan_trt.engines.flops import graph_flops, roofline_ms, throughput
from wan_trt.engines.runtime.arithmetic import computed_as
from wan_trt.engines.runtime.cublas_workspace import prefer_workspace_free_gemms
from wan_trt.engines.runtime.decoder import DecoderStream, check_attachable
from wan_trt.engines.runtime.finite import NonFiniteBlock, first_non_finite
from wan_trt.engines.runtime.runner import Runner, check_device
from wan_trt.engines.runtime.session import StreamingSession, stream_blocks
from wan_trt.errors import WanTrtError, failure_text
from wan_trt.export.decoder import read_decoder, read_transformer
from wan_trt.export.manifest import reference_model
from wan_trt.log import logger, stage
from wan_trt.model import decoder_config
from wan_trt.pipeline import ReferencePipeline
from wan_trt.profiling import (allocated_memory_gib, op_class_profile, peak_memory_gib, provenance,
                               reset_peak_memory, summarize_ms, synchronize)
from wan_trt.outputs import json_with_keys, locked_out_file, resolved, write_file
from wan_trt.owned import BENCH_REPORT_KEYS, is_bench_report
from wan_trt.spec import LATENTS
from wan_trt.stream import NoiseSource, synthetic_stream

# Warm-up blocks left out of a row's times: the first (its CUDA graphs are captured), and with a decoder the
# second too (DECODER_WARMUP_BLOCKS). A run needs at least one block more.
WARMUP_BLOCKS = 1


def warmup_blocks(decoded: bool) -> int:
    """Warm-up blocks of a run, with (``decoded``) or without a decoder."""
    return DECODER_WARMUP_BLOCKS if decoded else WARMUP_BLOCKS
CHART_SOFTWARE = "wan-trt bench"  # the charts' PNG tEXt Software


def block_stats(block_seconds: list[float], pass_seconds: list[float], cfg: WanConfig, warmup: int = 1
                ) -> dict[str, Any]:
    """Stats of the steady blocks: those after the first ``warmup`` (there must be some: a run too short
    for them is refused up front, :func:`run_bench`). ``ms_per_pass`` only where passes were timed one
    by one (``None`` otherwise: a block's time over its passes would count the work between them);
    ``video_fps``: the video frames a steady block of ``cfg`` decodes to, over the mean block time."""
    steady = [1e3 * s for s in block_seconds[warmup:]]
    if not steady:
        raise WanTrtError(f"{len(block_seconds)} block(s) timed, none after the {warmup} warm-up block(s)")
    block = summarize_ms(steady)
    return {"block_ms": block, "block_ms_all": [1e3 * s for s in block_seconds],
            "ms_per_pass": summarize_ms([1e3 * s for s in pass_seconds]) if pass_seconds else None,
            "video_fps": steady_video_frames(cfg) / (block["mean"] / 1e3)}


def steady_video_frames(cfg: WanConfig) -> int:
    """Video frames a block after the first decodes to (12 for 3 latent frames)."""
    return decoder_config(cfg).video_frames(cfg.block_frames, first=False)


def bench_session(runner: Runner, inputs, blocks: int, timed_blocks: int = 3,
                  decoder: DecoderStream | None = None) -> dict[str, Any]:
    """Stream ``blocks`` blocks through the static-cache session over ``runner`` as a user would
    (no device sync between passes), then ``timed_blocks`` more with every pass synchronised and timed.
    With ``decoder`` every block is also decoded to frames (end to end); ``stage_ms`` gives the
    steady blocks' median per stage. Steady: after :data:`WARMUP_BLOCKS`, with a decoder after
    :data:`DECODER_WARMUP_BLOCKS`."""
    with runner, contextlib.ExitStack() as stack:
        if decoder is not None:
            stack.enter_context(decoder)
        session = StreamingSession(runner, noise=NoiseSource(0), decoder=decoder)
        results = stream_blocks(session, inputs, blocks)
        timed = stream_blocks(session, inputs, min(blocks, timed_blocks + 1), time_passes=True)
    passes = [s for r in timed[1:] for s in r.pass_seconds]
    warmup = warmup_blocks(decoder is not None)
    stats = block_stats([r.seconds for r in results], passes, runner.spec.config, warmup)
    steady = results[warmup:]
    stats["stage_ms"] = {k: statistics.median(r.stage_ms[k] for r in steady) for k in steady[0].stage_ms}
    return stats


def bench_upstream(model, inputs, blocks: int, device: str) -> dict[str, Any]:
    """The upstream-semantics pipeline on ``device``: time between yields = one block (and the previous clean
    pass). A block whose latents come out NaN/Inf fails the row, as the session's rows do (its check runs
    after the block's time is taken)."""
    times, last = [], time.perf_counter()
    for block, latents in enumerate(ReferencePipeline(model).run(inputs, blocks, NoiseSource(0))):
        synchronize(device)
        now = time.perf_counter()
        times.append(now - last)
        if first_non_finite({LATENTS: latents}) is not None:
            raise NonFiniteBlock(f"{LATENTS} of block {block} came out non-finite (NaN or Inf)", block=block,
                                 tensor=LATENTS)
        last = time.perf_counter()
    return block_stats(times, [], model.cfg)


class Bench:
    """Makes each backend's runner from the registry, lazily, and records its numbers (or why it was skipped)."""

    def __init__(self, directory: Path, device: str, engines: dict[str, Path | None]):
        self.directory = directory
        self.manifest = read_transformer(directory, "bench")
        self.spec = self.manifest.spec
        self.device = device
        for key, engine in engines.items():  # an engine under another backend's flag would be run and named as that
            if engine is not None:
                meta = EngineMetadata.read(engine)
                meta.check_runs_as(key, engine, ENGINE_FLAGS[key],
                                   f"give it with {ENGINE_FLAGS.get(meta.backend_name, 'its own flag')}")
                meta.check_runs_on(device, engine, ENGINE_FLAGS[key])
        self.sources = RunnerSources(self.spec, device, self.model, self.manifest, directory, engines)
        self._models: dict[str, Any] = {}

    def model(self, ops: str = "native"):
        """The export's PyTorch model in its precision (``ops='plugins'``: with the fused kernels; fp8: with its
        FP8 GEMMs), built once."""
        if ops not in self._models:
            model = reference_model(self.manifest, self.spec.dtype, self.device)
            if self.spec.precision == "fp8" and str(self.device).startswith("cuda"):
                check_fp8_device("cuda")
            model = model.use_fp8() if self.spec.precision == "fp8" else model
            self._models[ops] = model.use_plugins() if ops == "plugins" else model
        return self._models[ops]

    def runner(self, backend: str) -> Runner:
        """The runner of ``backend``; :class:`Unavailable` says why this machine cannot run it."""
        return make_runner(backend, self.sources)

    @cached_property
    def flops_per_block(self) -> float:
        return graph_flops(self.spec) * self.spec.config.passes_per_block

    def run(self, backend: str, blocks: int, decoder: DecoderStream | None = None) -> dict[str, Any]:
        inputs = synthetic_stream(self.spec.config, blocks, seed=0)
        reset_peak_memory(self.device)
        start = allocated_memory_gib(self.device)
        if get_backend(backend).reference_pipeline:
            with computed_as(self.spec.dtype):  # fp32 as fp32, as the runners of the other rows compute it
                result = bench_upstream(self.model(), inputs, blocks, self.device)
        else:
            result = bench_session(self.runner(backend), inputs, blocks, decoder=decoder)
        # a row that decodes too did the decoder's arithmetic in its blocks' time
        flops = self.flops_per_block + (graph_flops(decoder.spec) if decoder is not None else 0)
        result.update(throughput(flops, result["block_ms"]["p50"]))
        result.update(peak_torch_mem_gib=peak_memory_gib(self.device), start_torch_mem_gib=start)
        return result

    def profile(self, backend: str) -> dict[str, Any]:
        """Op-class profile of one steady-state pass of ``backend``."""
        runner = self.runner(backend)
        feeds = self.spec.sample_inputs(device=self.device)
        with runner, torch.no_grad():
            for _ in range(3):
                runner.infer(feeds)
            return op_class_profile(lambda: runner.infer(feeds), runner.device)


def _fields(config: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """A config's fields by dotted name ('model.ffn_dim')."""
    out: dict[str, Any] = {}
    for key, value in config.items():
        out.update(_fields(value, f"{prefix}{key}.") if isinstance(value, dict) else {prefix + key: value})
    return out


@dataclass
class OtherEngine:
    """An engine of another export of the same config, benched beside the run's own rows."""

    engine: Path
    export: Path
    key: str  # its registry engine_key
    precision: str
    device: str

    @classmethod
    def of(cls, engine: Path, device: str, config: WanConfig) -> "OtherEngine":
        """Checks ``engine`` before any work (its export's files are verified when it is benched): a DiT
        engine of an export of ``config`` (every field, not only its name) that still exists."""
        meta = EngineMetadata.read(engine)
        meta.check_runs_on(device, engine, "--also-engine")
        export, manifest = export_for_engine(engine, meta, verify=False)  # verified when it is benched
        spec = manifest.spec
        if spec.KIND != "pass" or meta.config != config.name:
            raise WanTrtError(f"--also-engine {engine}: a {meta.config} {spec.KIND} engine; this run benches "
                              f"{config.name} denoising passes")
        if spec.config.to_dict() != config.to_dict():  # another model that took the name: its rows are not this one's
            theirs, ours = _fields(spec.config.to_dict()), _fields(config.to_dict())
            differ = sorted(k for k in set(theirs) | set(ours) if theirs.get(k) != ours.get(k))
            raise WanTrtError(f"--also-engine {engine}: its export's config is named {config.name} but differs from "
                              f"this run's ({', '.join(differ)}); bench it beside an export of its own config")
        return cls(engine, export, meta.backend_name, meta.precision, device)

    @property
    def backends(self) -> tuple[str, ...]:
        """The registry backends that run it: its own, and with CUDA graphs."""
        return tuple(b.name for b in BACKENDS if b.engine_key == self.key)

    @cached_property
    def bench(self) -> Bench:
        return Bench(self.export, self.device, {self.key: self.engine})

    def row(self, backend: str) -> str:
        return f"{backend}@{self.precision}"

    def must_run(self, backend: str) -> bool:
        """Its own backend must run; its CUDA-graph variant on a CUDA device (skipped, with why, elsewhere)."""
        return not get_backend(backend).cuda_graph or torch.device(self.device).type == "cuda"


@dataclass(frozen=True)
class BenchOptions:
    """What `wan-trt bench` was asked for, beside the export directory.

    Attributes:
        backends: the backends to run, each of which must run (None: every registered backend,
            skipping with the reason those this machine cannot run).
        blocks: blocks streamed per backend.
        device: torch device of the run.
        engines: engine files by registry ``engine_key`` ('aoti', 'aoti-plugins', 'tensorrt').
        profile: backends to profile by op class (each must be among the benched ones), and
            ``decoder`` (:data:`DECODER_PROFILE`) for the decoder engine's steady call.
        decoder: a decoder export (`wan-trt export --graph decoder`) to bench beside the DiT.
        decoder_engine: either engine file of that decoder (`wan-trt build DECODER`).
        end_to_end: DiT backends (each among the benched ones) to run again with the decoder engine
            attached, every block decoded to frames: ``<backend>+decoder`` rows.
        also_engines: engines of other exports of the same config (e.g. other precisions), benched in
            this run too: ``<backend>@<precision>`` rows (their CUDA-graph variant skipped off CUDA).
        out: JSON results file. chart: PNG chart of ms per block.
        overwrite: replace an earlier report / chart of `wan-trt bench` at ``out`` / ``chart`` (nothing
            else is ever replaced).
    """

    backends: tuple[str, ...] | None = None
    blocks: int = 6
    device: str = "cuda"
    engines: dict[str, Path | None] = field(default_factory=dict)
    profile: tuple[str, ...] = ()
    decoder: Path | None = None
    decoder_engine: Path | None = None
    end_to_end: tuple[str, ...] = ()
    also_engines: tuple[Path, ...] = ()
    out: Path | None = None
    chart: Path | None = None
    overwrite: bool = False


def run_bench(directory: str | Path, options: BenchOptions) -> dict[str, Any]:
    """Run ``options.backends`` (None: every backend, skipping with the reason those this machine cannot run).

    Named backends must run: one that cannot, or that raises, lands in ``report["failed"]``.
    """
    o = options
    prefer_workspace_free_gemms()  # before any GEMM: every row, torch's too, runs as the engines' runtime does
    check_device(o.device)  # before any model is built
    named = o.backends is not None
    backends = list(ALL_BACKENDS) if o.backends is None else parse_backends(",".join(o.backends))
    for key, engine in o.engines.items():  # an engine no benched row runs would be taken and never benched
        if engine is not None and named and not any(get_backend(b).engine_key == key for b in backends):
            rows = ", ".join(b.name for b in BACKENDS if b.engine_key == key)
            raise WanTrtError(f"{ENGINE_FLAGS[key]} {engine}: --backends has no {key} row ({rows}); add one, or "
                              "drop the flag")
    if o.overwrite and o.out is None and o.chart is None:  # an option the run would not use is refused, never dropped
        raise WanTrtError("--overwrite: the bench writes no file without --out or --chart for it to replace; give one "
                          "or drop --overwrite")
    if o.chart is not None and importlib.util.find_spec("matplotlib") is None:
        raise WanTrtError(f"--chart {o.chart}: drawing it needs matplotlib, which is not installed "
                          "(`pip install matplotlib`); drop --chart or install it")
    backend_profiles = [p for p in o.profile if p != DECODER_PROFILE]  # the decoder's is in report["decoder"]
    config = read_transformer(directory, "bench", verify=False).spec.config
    others = [OtherEngine.of(Path(e), o.device, config) for e in o.also_engines]
    pairs = [(other.row(b), (other, b)) for other in others for b in other.backends]
    rows = [row for row, _ in pairs]
    twice = sorted({r for r in rows if rows.count(r) > 1})
    if twice:
        raise WanTrtError(f"--also-engine: rows named twice: {', '.join(twice)} (one engine per backend and precision)")
    other_rows = dict(pairs)
    not_benched = [p for p in backend_profiles if p not in backends and p not in other_rows]
    if not_benched:
        raise WanTrtError(f"--profile {','.join(not_benched)}: not among the benched backends "
                          f"({', '.join([*backends, *other_rows])})")
    pipelines = [p for p in backend_profiles if p not in other_rows and get_backend(p).reference_pipeline]
    if pipelines:
        raise WanTrtError(f"--profile {','.join(pipelines)}: the reference pipeline has no single pass to profile; "
                          "profile torch-eager instead")
    if DECODER_PROFILE in o.profile and o.decoder_engine is None:
        raise WanTrtError(f"--profile {DECODER_PROFILE}: give the decoder engine (--decoder-engine) and its export "
                          "(--decoder)")
    if o.profile and torch.device(o.device).type != "cuda":
        raise WanTrtError(f"--profile {','.join(o.profile)}: a profile reads the GPU's kernel times; run it with "
                          "--device cuda")
    if o.end_to_end:
        parse_backends(",".join(o.end_to_end), "--end-to-end")
    not_benched = [b for b in o.end_to_end if b not in backends or get_backend(b).reference_pipeline]
    if not_benched or (o.end_to_end and o.decoder_engine is None):
        raise WanTrtError(f"--end-to-end {','.join(o.end_to_end)}: needs --decoder-engine and static-cache backends "
                          f"among the benched ones ({', '.join(backends)}; the reference pipeline has no session)")
    for name in o.end_to_end:  # what its row needs, said before the other rows run (it runs last)
        missing = missing_engine(get_backend(name), o.engines)
        if missing is not None:
            raise WanTrtError(f"--end-to-end {name}: {missing}")
    if o.decoder_engine is not None and o.decoder is None:
        raise WanTrtError("--decoder-engine: give the decoder export with --decoder too")
    decoder_spec = None
    if o.decoder is not None:  # before any benching
        decoder_manifests = read_decoder(o.decoder)
        decoder_spec = decoder_manifests["steady"].spec
        check_decoder_request(o.decoder, decoder_manifests, o.decoder_engine, o.device)
    blocks, out, chart = o.blocks, o.out, o.chart
    warmup = warmup_blocks(o.decoder is not None)
    if blocks <= warmup:
        raise WanTrtError(f"--blocks {blocks}: the first {warmup} block(s) are warm-up"
                          f"{' (the decoder rows: graphs captured in both)' if o.decoder is not None else ''}, "
                          f"timed apart from the steady ones; give --blocks {warmup + 1} or more")
    if out is not None and chart is not None and resolved(Path(out), "--out") == resolved(Path(chart), "--chart"):
        raise WanTrtError(f"--out and --chart are both {out}: the chart would replace the report; give two files")
    with contextlib.ExitStack() as locks:  # held to the end: a second bench writing one of them fails at once
        for flag, path, written, what in (("--out", out, is_bench_report, "wan-trt bench report"),
                                          ("--chart", chart, is_chart,
                                           "chart wan-trt bench drew (an older wan-trt's charts carry no mark)")):
            if path is not None:
                locks.enter_context(locked_out_file(Path(path), flag, written, what, overwrite=o.overwrite,
                                                    writer="bench"))
        return _bench_rows(Path(directory), o, backends, named, other_rows, backend_profiles, decoder_spec)


def _bench_rows(directory: Path, o: BenchOptions, backends: list[str], named: bool, other_rows: dict[str, Any],
                backend_profiles: list[str], decoder_spec: Any) -> dict[str, Any]:
    """:func:`run_bench` once its request is judged and its outputs locked: every row, saved after each."""
    blocks, out, chart = o.blocks, o.out, o.chart
    bench = Bench(directory, o.device, {k: Path(v) if v else None for k, v in o.engines.items()})
    cfg = bench.spec.config
    if o.end_to_end:
        check_attachable(decoder_spec, bench.spec)
    report: dict[str, Any] = {**provenance("wan-trt", o.device),
                              "config": cfg.name, "precision": bench.spec.precision, "blocks": blocks,
                              "passes_per_block": cfg.passes_per_block, "weights": bench.manifest.weights,
                              "flops_per_block": bench.flops_per_block,
                              "roofline_ms_dense_bf16_h100": roofline_ms(bench.flops_per_block),
                              "backends": {}, "skipped": {}, "failed": {}, "profiles": {}, "end_to_end": {},
                              # saved after every row: a run that was killed leaves complete false, its rest pending
                              "complete": False,
                              "pending": [*backends, *other_rows, *(["decoder"] if o.decoder is not None else []),
                                          *(f"{b}+decoder" for b in o.end_to_end),
                                          *(f"profile {b}" for b in backend_profiles)]}

    # Saved after every row. An earlier report being replaced (--overwrite) stays whole until this one is: the
    # rows so far go beside it (.NAME.incomplete), so a killed run leaves both.
    progress = Path(out) if out else None
    if progress is not None and progress.exists():
        progress = progress.with_name(f".{progress.name}.incomplete")
        if progress.exists() and not json_with_keys(progress, BENCH_REPORT_KEYS):  # not a killed run's rows: the user's
            raise WanTrtError(f"--out {out}: {progress} beside it, where this run keeps its rows until it replaces "
                              "the earlier report, is not a wan-trt bench report; move it away, or give another --out")

    def save(done: str | None = None) -> None:
        if done is not None:
            report["pending"].remove(done)
        if out:
            write_file(Path(out) if report["complete"] else progress, json.dumps(report, indent=2).encode())

    save()  # an unwritable --out fails now, not after minutes of benchmarking
    for backend in backends:
        _bench_one(report, "backends", backend, named, run=lambda: bench.run(backend, blocks))
        save(backend)
    for row, (other, backend) in other_rows.items():
        _bench_one(report, "backends", row, other.must_run(backend),
                   run=lambda: {**other.bench.run(backend, blocks), "precision": other.precision,
                                "export": str(other.export)})
        save(row)
    if o.decoder is not None:
        with stage("bench the video decoder"):
            report["decoder"] = bench_decoder(Path(o.decoder), o.decoder_engine, o.device, blocks,
                                              profile=DECODER_PROFILE in o.profile)
        report["failed"].update({f"decoder {name}": why for name, why in report["decoder"]["failed"].items()})
        save("decoder")
    for backend in o.end_to_end:
        graphed = engine_variants(o.decoder_engine, o.device)[-1]
        _bench_one(report, "end_to_end", f"{backend}+decoder", named=True,
                   run=lambda: bench.run(backend, blocks, DecoderStream.from_engine(o.decoder_engine, graphed,
                                                                                     o.device)))
        save(f"{backend}+decoder")
    for backend in backend_profiles:
        if backend in report["backends"]:
            with stage(f"profile {backend}"):
                other, name = other_rows.get(backend, (None, backend))
                report["profiles"][backend] = (other.bench if other else bench).profile(name)
        else:
            record_unprofiled(report, backend)
        save(f"profile {backend}")
    if chart and report["backends"]:
        write_chart(report, Path(chart))
    elif chart and Path(chart).exists():  # an earlier run's (checked above): it would pass for this run's
        Path(chart).unlink()
        logger.warning("no pass row ran, so no chart: removed the earlier chart %s", chart)
    report["complete"] = True
    save()
    if progress is not None and progress != Path(out):
        progress.unlink(missing_ok=True)
    return report


def record_unprofiled(report: dict[str, Any], backend: str) -> None:
    """``--profile backend`` of a row that failed or was skipped: the report's ``failed`` says why it has no
    profile (under ``profile <backend>``), as the log does."""
    why = "failed" if backend in report["failed"] else "was skipped"
    report["failed"][f"profile {backend}"] = f"not profiled: its bench row {why} (see its entry)"
    logger.error("profile %s: not profiled, its bench row %s", backend, why)


def _bench_one(report: dict[str, Any], section: str, backend: str, named: bool, run) -> None:
    """Bench one row into ``report[section]``: its numbers (``run()``), why it was skipped, or why it failed."""
    try:
        with stage(f"bench {backend}"):
            report[section][backend] = run()
        logger.info("%s: %.1f ms/block", backend, report[section][backend]["block_ms"]["mean"])
    except Unavailable as exc:
        if named:
            report["failed"][backend] = f"asked for, but cannot run on this machine: {exc}"
            logger.error("%s cannot run: %s", backend, exc)
        else:
            report["skipped"][backend] = str(exc)
            logger.info("%s skipped: %s", backend, exc)
    except WanTrtError as exc:  # e.g. an engine built for another export
        report["failed"][backend] = failure_text(exc)
        logger.error("%s failed: %s", backend, exc)
    except Exception as exc:  # a backend that breaks is a failure with its traceback; the others still run
        report["failed"][backend] = failure_text(exc)
        logger.exception("%s failed", backend)


def write_chart(report: dict[str, Any], path: Path) -> Path | None:
    """Bar chart of ms per block per backend (PNG); skipped when matplotlib is missing."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        logger.info("matplotlib is not installed: no chart")
        return None
    names = list(report["backends"])
    means = [report["backends"][n]["block_ms"]["mean"] for n in names]
    fig, ax = plt.subplots(figsize=(8, 0.5 + 0.45 * len(names)))
    ax.barh(names, means, color="#4c72b0")
    for y, value in enumerate(means):
        ax.text(value, y, f" {value:.1f}", va="center")
    ax.invert_yaxis()
    ax.set_xlabel("ms per steady-state block (lower is better)")
    ax.set_title(f"{report['config']} {report['precision']} on {report['environment'].get('device', '?')}")
    fig.tight_layout()
    png = io.BytesIO()
    fig.savefig(png, format="png", dpi=110, metadata={"Software": CHART_SOFTWARE})
    plt.close(fig)
    write_file(path, png.getvalue())
    return path


def is_chart(path: Path) -> bool:
    """Whether ``path`` is a PNG chart `wan-trt bench` drew (its tEXt chunk ``Software``)."""
    try:
        data = path.read_bytes()
    except OSError:
        return False
    if not data.startswith(b"\x89PNG\r\n\x1a\n"):
        return False
    at = 8
    while at + 8 <= len(data):
        length, kind = struct.unpack(">I4s", data[at:at + 8])
        if kind == b"tEXt" and data[at + 8:at + 8 + length] == b"Software\0" + CHART_SOFTWARE.encode():
            return True
        if kind == b"IEND":
            break
        at += 12 + length
    return False
