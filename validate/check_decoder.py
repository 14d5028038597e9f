"""``wan-trt check`` of the video decoder: both graphs against PyTorch, one call each and a stream.

Single call (Polygraphy, as for the DiT): each graph (first, steady) on its export's sample inputs
against the fp32 PyTorch decoder, with the decoder in the graph's precision as the yardstick, ``rgb``
judged by the same policy as the DiT's outputs. The histories (about 1 GB per call at 352x640:
comparing them on the host took minutes) are judged through the stream: a history that is wrong
changes the next block's frames.

Stream: ``blocks`` blocks of seeded latents decoded block by block through both graphs (histories
carried), each block's frames compared with the fp32 decoder's decode of the whole clip at once
(upstream's semantics: one call, the first-frame rule once), the yardstick being the PyTorch decoder
in the graph's precision streamed the same way. The stream thus also proves the histories: a graph
that drops or misplaces one drifts from the whole-clip decode. So a decoder check always streams, at
least 2 blocks (the steady graph reads histories from the second on); fewer, or none, is refused.
"""
from __future__ import annotations

import dataclasses
from pathlib import Path

import torch

from wan_trt.decoder_spec import CALLS, RGB, DecoderSpec
from wan_trt.engines.artifact import EngineMetadata, export_for_engine
from wan_trt.engines.backends import backend_module, get_backend
from wan_trt.engines.backends.torch import TorchRunner
from wan_trt.engines.runtime.arithmetic import fp32_as_fp32
from wan_trt.engines.runtime.decoder import DecoderStream, PairedEngine, paired_engines
from wan_trt.engines.runtime.runner import Runner
from wan_trt.errors import WanTrtError
from wan_trt.export.decoder import decoder_dirs, read_decoder
from wan_trt.export.manifest import MANIFEST, Manifest, reference_models
from wan_trt.log import logger, stage
from wan_trt.owned import recorded_files
from wan_trt.spec import LATENTS
from wan_trt.validate.check import (CheckOptions, CheckReport, OutputCheck, check_engine, check_export,
                                    check_single_pass, clear_report, engine_report_name, folder_identities,
                                    former_report_name, identities_of_read, report_locked, report_path,
                                    require_blocks_fit, require_polygraphy, results_path, results_staged,
                                    verified_runners, write_report)
from wan_trt.validate.metrics import error_stats, passes, tolerance


MIN_BLOCKS = 3  # a decoder's stream check: the first graph's histories are read in block 1, the steady's in block 2


def require_history_check(options: CheckOptions, kind: str) -> None:
    """The single calls judge ``rgb`` only; the histories are judged by the stream where they are read: the first
    graph's in the second block, the steady graph's own in the third. A decoder check streams at least
    :data:`MIN_BLOCKS` blocks (``kind``: the decoder's graph kind, whose default it takes when none is asked)."""
    options = options.as_run(kind)
    if not options.stream or options.blocks < MIN_BLOCKS:
        asked = "--no-stream" if not options.stream else f"--blocks {options.blocks}"
        raise WanTrtError(f"{asked}: a decoder's histories are judged by the stream check where they are read (the "
                          "first graph's in block 2, the steady graph's in block 3); check a decoder with "
                          f"--blocks {MIN_BLOCKS} or more")


@fp32_as_fp32()
def check_decoder(dirs: dict[str, Path], manifests: dict[str, Manifest], runners: dict[str, Runner],
                  options: CheckOptions, pair: dict[str, PairedEngine] | None = None,
                  named: Path | None = None, identity: dict[Path, tuple[int, int] | None] | None = None
                  ) -> CheckReport:
    """Check the decoder graphs run by ``runners`` (by call) against the PyTorch decoder; ``pair``: the
    engines run (by call), or None for the exports' graphs; ``named``: the engine file the check was asked
    for (either of the pair: the report's ``target`` and ``engine_sha256``; both engines are in its
    ``engines``). The report is written to ``<steady export>/check/report_<engine file name or backend>.json``
    (:func:`report_path`). ``identity``: :func:`folder_identities` of ``dirs`` taken before the manifests were
    read (defaults to taking it here)."""
    kind = manifests["steady"].spec.KIND
    require_history_check(options, kind)
    options = options.as_run(kind)
    require_polygraphy()
    identity = identity if identity is not None else folder_identities(*dirs.values())
    spec = manifests["steady"].spec
    require_blocks_fit(options.blocks, spec, LATENTS, RGB)
    device = str(runners["steady"].device)
    name = f"decoder-{runners['steady'].name}"
    file_name = f"decoder-{engine_report_name(pair['steady'].path, dirs['steady'])}" if pair is not None else name
    path, results = report_path(dirs["steady"], file_name), {c: results_path(dirs[c], file_name) for c in CALLS}
    former = former_report_name(pair["steady"].path, dirs["steady"], prefix="decoder-") if pair is not None else None
    with report_locked(path):
        clear_report(path, *results.values(), *((report_path(dirs["steady"], former),
                                                 *(results_path(dirs[c], former) for c in CALLS)) if former else ()))
        with stage("rebuild the PyTorch decoders"):
            low, fp32 = reference_models(manifests["steady"], device)
        engines = {c: {"path": str(e.path.resolve()), "sha256": e.meta.engine_file.get("sha256")}
                   for c, e in (pair or {}).items()}
        target = Path(named if named is not None else
                      pair["steady"].path if pair is not None else dirs["steady"].parent)
        ran = [c for c, e in engines.items() if e["path"] == str(target.resolve())]
        if pair is not None and not ran:
            raise WanTrtError(f"{target}: not an engine of the decoder pair checked ({', '.join(engines)})")
        report = CheckReport(name, spec.precision, target=str(target.resolve()), device=device,
                             engine_sha256=engines[ran[0]]["sha256"] if ran else None,
                             options=dataclasses.asdict(options), engines=engines,
                             manifests={str(dirs[c].resolve()): manifests[c].sha256 for c in CALLS})
        with results_staged(results if options.save_results else {}, identity, "the decoder") as staging:
            for call in CALLS:
                call_spec = manifests[call].spec
                reference = TorchRunner(fp32, type(spec).from_config(spec.config, "fp32", call))
                reference.name = "torch-fp32"
                yardstick = TorchRunner(low, call_spec)
                yardstick.name = f"torch-{spec.precision}"
                feeds = manifests[call].sample_feeds(dirs[call])
                with stage(f"{call} call (Polygraphy Comparator)"):
                    outputs = check_single_pass(runners[call], reference, yardstick, feeds, call_spec,
                                                staging.get(call), judged=[RGB])
                report.outputs += [OutputCheck(f"{call}:{o.name}", o.stats, o.yardstick, o.allowed_rel_l2,
                                               o.polygraphy_ok) for o in outputs]
            if options.stream:
                with stage(f"stream of {options.blocks} blocks vs the whole clip decoded at once"):
                    report.stream = decoder_stream_rows(runners, fp32, low, options.blocks, options.seed)
        write_report(path, report)
        logger.info("check %s: %s (report: %s)", report.backend, "passed" if report.ok else "FAILED", path)
    return report


def stream_latents(spec: DecoderSpec, blocks: int, seed: int) -> torch.Tensor:
    """Seeded latents of ``blocks`` blocks, [1, 16, blocks * F, h, w] fp32 on the CPU."""
    b, c, f, h, w = spec.tensor(LATENTS).shape
    return torch.randn((b, c, blocks * f, h, w), generator=torch.Generator().manual_seed(seed))


@torch.no_grad()
def decode_whole_clip(decoder, latents: torch.Tensor) -> torch.Tensor:
    """The reference: the whole clip decoded in one call from empty histories, fp32 [1, 3, T', H, W] on the CPU.
    One that does not fit in the GPU's memory is refused saying so (it grows with --blocks)."""
    weight = next(decoder.parameters())
    dtype, device = weight.dtype, weight.device
    history = decoder.empty_history(latents.shape[0], *latents.shape[-2:])
    try:
        rgb, _ = decoder(latents.to(device, dtype), history, first=True)
    except torch.OutOfMemoryError:
        torch.cuda.empty_cache()
        raise WanTrtError(f"the decoder's stream check compares its blocks with the whole clip decoded at once, and "
                          f"that clip ({latents.shape[2]} latent frames, {str(dtype).removeprefix('torch.')}) does "
                          f"not fit in {device}'s memory: pass fewer --blocks (at least {MIN_BLOCKS}), or check on "
                          "a device with more memory") from None
    return rgb.float().cpu()


@torch.no_grad()
def decode_blocks(first: Runner, steady: Runner, latents: torch.Tensor, block_frames: int) -> list[torch.Tensor]:
    """Each block's frames from a :class:`DecoderStream` over the two runners, fp32 on the CPU."""
    dtype = steady.spec.dtype
    with DecoderStream(first, steady) as decoder:
        blocks = (latents[:, :, i:i + block_frames].to(decoder.device, dtype)
                  for i in range(0, latents.shape[2], block_frames))
        return [decoder.decode_rgb(z).to("cpu", torch.float32, copy=True) for z in blocks]


def decoder_stream_rows(runners: dict[str, Runner], fp32, low, blocks: int, seed: int) -> list[dict]:
    spec = runners["steady"].spec
    f = spec.config.block_frames
    latents = stream_latents(spec, blocks, seed)
    whole = decode_whole_clip(fp32, latents)
    got = decode_blocks(runners["first"], runners["steady"], latents, f)
    # the yardstick: the whole clip decoded at once in the graph's precision, which shares no code with the
    # stream under check (its blocks decoded by the same DecoderStream erred with it, and lent twice that error)
    yard = decode_whole_clip(low, latents)
    rows, start = [], 0
    for i, g in enumerate(got):
        expected, y = (clip[:, :, start:start + g.shape[2]] for clip in (whole, yard))
        start += g.shape[2]
        stats, base = error_stats(g, expected), error_stats(y, expected)
        allowed = tolerance(base.rel_l2, spec.precision)
        rows.append({"block": i, "video_frames": g.shape[2], **stats.as_dict(), "yardstick_rel_l2": base.rel_l2,
                     "allowed_rel_l2": allowed, "ok": passes(stats, allowed)})
    if start != whole.shape[2]:
        rows.append({"block": len(got), "max_abs": float("nan"), "mean_abs": float("nan"), "rel_l2": float("inf"),
                     "cosine": float("nan"), "non_finite": 0, "allowed_rel_l2": float("nan"), "ok": False,
                     "error": f"the blocks gave {start} frames, the whole clip {whole.shape[2]}"})
    return rows


def require_not_export_file(target: Path) -> None:
    """Refuse a file of an export (its graph, external data, sample inputs or manifest) given as the engine to
    check, naming the export to check instead (a decoder's whole export for one of its graphs): read as an engine,
    it was said to be "not built by `wan-trt build`; rebuild it"."""
    directory = target.parent
    names = recorded_files(directory / MANIFEST)
    if names is None or target.name not in (MANIFEST, *names):
        return
    export = directory.parent if decoder_dirs(directory.parent) is not None else directory
    raise WanTrtError(f"{target} is a file of the export {export}, not an engine: check the export with "
                      f"`wan-trt check {export}` (ONNX Runtime), or an engine `wan-trt build` made from it")


def check_target(target: str | Path, options: CheckOptions = CheckOptions()) -> CheckReport:
    """``wan-trt check TARGET``: an export directory (ONNX Runtime) or an engine file, DiT or decoder."""
    target = Path(target)
    if target.is_dir():
        dirs = decoder_dirs(target)
        if dirs is None:
            return check_export(target, options)
        identity = folder_identities(*dirs.values())  # before the manifests are read: a report is of the folders read
        manifests = read_decoder(target)
        require_history_check(options, manifests["steady"].spec.KIND)
        onnxruntime = backend_module(get_backend("onnxruntime"))
        runners = {c: onnxruntime.check_runners(dirs[c], manifests[c], options.provider)[0] for c in CALLS}
        return check_decoder(dirs, manifests, runners, options, identity=identity)
    require_not_export_file(target)
    meta = EngineMetadata.read(target)
    directory, manifest = export_for_engine(target, meta)
    if not isinstance(manifest.spec, DecoderSpec):
        return check_engine(target, options)
    pair = paired_engines(target)  # the two engines, of one decoder's two exports
    require_history_check(options, pair["steady"].manifest.spec.KIND)
    identity = {**identities_of_read({e.directory: e.manifest for e in pair.values()}, "the decoder"),  # before loading
                **folder_identities(*(e.path for e in pair.values()))}
    runners = {call: verified_runners(e.path, e.meta, e.manifest)[0] for call, e in pair.items()}
    return check_decoder({c: e.directory for c, e in pair.items()}, {c: e.manifest for c, e in pair.items()},
                         runners, options, pair, target, identity)
