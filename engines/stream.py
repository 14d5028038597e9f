"""``wan-trt stream``: synthetic input through the static-cache runtime (the registry's ``torch-eager``
backend), optionally checked against the reference pipeline."""
from __future__ import annotations

import contextlib
import dataclasses
import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from wan_trt.actions import action_magnitudes, read_actions
from wan_trt.cli_options import DECODERS
from wan_trt.config import WanConfig
from wan_trt.decoder_spec import CALLS
from wan_trt.engines.backends import RunnerSources, make_runner
from wan_trt.engines.backends.torch import TorchRunner
from wan_trt.engines.runtime.decoder import DecoderStream
from wan_trt.engines.runtime.finite import NonFiniteBlock
from wan_trt.engines.runtime.runner import check_device
from wan_trt.engines.runtime.session import StreamingSession, stream_blocks
from wan_trt.digest import file_digest, file_identity, require_unchanged
from wan_trt.errors import WanTrtError
from wan_trt.log import logger, stage
from wan_trt.outputs import check_input_file, check_out_dir, json_values, staged_dir
from wan_trt.owned import STREAM_FILES, owned_stream_files
from wan_trt.graphs import GRAPH_KINDS
from wan_trt.model import build_model
from wan_trt.precisions import ENGINE_ONLY
from wan_trt.rotary import MAX_STREAM_FRAMES
from wan_trt.sizes import require_blocks, require_host_room
from wan_trt.spec import PassSpec, precision_dtype
from wan_trt.stream import NoiseSource, max_stream_blocks, synthetic_stream
from wan_trt.validate.metrics import error_stats, passes
from wan_trt.validate.stream import reference_stream
from wan_trt.video import FPS, write_mp4

OUTPUT = "stream output"
# rel-L2 allowed between the two pipelines: same model, same precision, different cache form
PIPELINE_TOLERANCE = {"fp32": 1e-4, "bf16": 3e-2, "fp16": 1e-2}


def check_stream_request(cfg: WanConfig, *, blocks: int, precision: str, device: str, weights: str | None,
                         out: Path | None, vae_weights: str | None = None, overwrite: bool = False,
                         actions: Path | None = None) -> None:
    """Everything about a stream that can be known before the model is built: refuse it up front."""
    require_blocks(blocks)
    most = max_stream_blocks(cfg)
    if blocks > most:
        raise WanTrtError(f"--blocks {blocks}: a stream reaches {MAX_STREAM_FRAMES} latent frames, "
                          f"{most} blocks of {cfg.block_frames}; pass --blocks {most} or fewer")
    require_host_room(blocks, blocks * bytes_per_block(cfg), "this command holds every block's inputs, latents and "
                      "frames", "pass fewer blocks (an embedded session streams without end: see the README)")
    if precision in ENGINE_ONLY:
        raise WanTrtError(f"--precision {precision}: streams from the PyTorch model run in "
                          f"{', '.join(PIPELINE_TOLERANCE)}; for {precision}, export and build an engine "
                          f"(`wan-trt build --precision {precision}`) and stream it from the runtime")
    if precision not in PIPELINE_TOLERANCE:
        raise WanTrtError(f"--precision {precision!r}: expected one of {', '.join(PIPELINE_TOLERANCE)}")
    check_device(device)
    files = input_files(weights, vae_weights, actions)
    for flag, path in files.items():  # before run_stream takes their identity (a missing file named no flag)
        check_input_file(path, flag)
    if out is not None:
        check_out_dir(out, owned_stream_files, overwrite=overwrite, protect=list(files.values()), what=OUTPUT)


def bytes_per_block(cfg: WanConfig) -> int:
    """Host bytes `wan-trt stream` keeps per block: fp32 conditioning and latents, uint8 frames."""
    f, h, w = cfg.block_frames, cfg.inference.latent_height, cfg.inference.latent_width
    frames = cfg.model.action_config.vae_time_compression_ratio * f * 64 * h * w * 3
    return 4 * (cfg.cond_channels + cfg.model.out_dim) * f * h * w + frames


@dataclass(frozen=True)
class StreamOptions:
    """What `wan-trt stream` was asked for, beside the config.

    Attributes:
        blocks: blocks to stream.
        precision: compute precision ('bf16', 'fp16', 'fp32').
        device: torch device ('cpu', 'cuda', 'cuda:N').
        weights: checkpoint path; seeded random weights when None.
        seed: seed of random weights, inputs and noise.
        reference: also run the upstream-semantics pipeline and report per-block errors.
        out: write latents.pt, report.json and (with ``video``) video.mp4 here.
        backend: the registered backend that runs the passes.
        video: decode the latents to frames and write them as ``out/video.mp4``.
        vae_weights: the decoder's checkpoint (the Wan2.1 VAE, or taew2_1.pth for the tiny decoder); seeded random
            weights when None.
        decoder: which video decoder makes the frames (:data:`wan_trt.cli_options.DECODERS`): 'wan' (Wan2.1's VAE
            decoder) or 'tiny' (TAEHV's: a twenty-fifth of the work, coarser frames); None: 'wan', as when the user
            named none (one named is refused where no video is written).
        actions: a JSON-lines file of the blocks' actions (:mod:`wan_trt.actions`); synthetic when None.
        overwrite: replace an earlier stream output at ``out`` (a folder with other files is never replaced).
    """

    blocks: int = 8
    precision: str = "fp32"
    device: str = "cpu"
    weights: str | None = None
    seed: int = 0
    reference: bool = False
    out: Path | None = None
    backend: str = "torch-eager"
    video: bool = True
    vae_weights: str | None = None
    actions: Path | None = None
    overwrite: bool = False
    decoder: str | None = None

    @property
    def decoder_kind(self) -> str:
        """The graph kind of the video decoder (:data:`DECODERS`)."""
        return DECODERS[self.decoder or "wan"]


def run_stream(cfg: WanConfig, options: StreamOptions) -> dict[str, Any]:
    """Stream ``options.blocks`` blocks; with ``options.reference`` also run the upstream-semantics pipeline.

    Every argument is checked before the model is built; nothing is written unless every block ran.
    """
    o = options
    blocks, precision, device, seed, out = o.blocks, o.precision, o.device, o.seed, o.out
    check_stream_request(cfg, blocks=blocks, precision=precision, device=device, weights=o.weights, out=out,
                         vae_weights=o.vae_weights, overwrite=o.overwrite, actions=o.actions)
    if out is None and o.overwrite:  # an option the run would not use is refused, never dropped
        raise WanTrtError("--overwrite: the stream writes nothing without --out; give --out or drop --overwrite")
    if o.vae_weights is not None and (out is None or not o.video):  # the decoder would never be built
        raise WanTrtError(f"--vae-weights {o.vae_weights}: the video decoder runs only when the stream writes its "
                          "video (--out, without --no-video); write the video or drop --vae-weights")
    if o.decoder is not None and o.decoder not in DECODERS:
        raise WanTrtError(f"--decoder {o.decoder}: expected one of {', '.join(DECODERS)}")
    if o.decoder is not None and (out is None or not o.video):
        raise WanTrtError(f"--decoder {o.decoder}: the video decoder runs only when the stream writes its video "
                          "(--out, without --no-video); write the video or drop --decoder")
    files = input_files(o.weights, o.vae_weights, o.actions)
    read = {flag: file_identity(path) for flag, path in files.items()}  # before any is read
    actions = {} if o.actions is None else read_actions(o.actions, cfg, blocks, precision_dtype(precision))  # first
    decoder = stream_decoder(cfg, o) if out is not None and o.video else None  # its checkpoint before the DiT's
    with stage(f"build {cfg.name} ({precision}, {device})"):
        model = build_model(cfg, precision_dtype(precision), device, o.weights, seed)
    spec = PassSpec.from_config(cfg, precision)
    inputs = dataclasses.replace(synthetic_stream(cfg, blocks, seed), **actions)
    sources = RunnerSources(spec, device, lambda ops="native": model)
    with stage(f"stream {blocks} blocks{' and decode them' if decoder else ''}"), \
            make_runner(o.backend, sources) as runner, decoder or contextlib.nullcontext():
        session = StreamingSession(runner, noise=NoiseSource(seed), decoder=decoder)
        try:
            results = stream_blocks(session, inputs, blocks, keep_frames_on="cpu")
        except NonFiniteBlock as exc:
            if not actions:
                raise
            raise WanTrtError(f"{exc}\n--actions {o.actions}: {action_magnitudes(actions, cfg, exc.block)}") from None
    for r in results:
        logger.info("block %d (frame %d): %.1f ms", r.index, r.start_frame, 1e3 * r.seconds)
    report: dict[str, Any] = {"config": cfg.name, "precision": precision, "device": device,
                              "block_ms": [1e3 * r.seconds for r in results]}
    summary = {"blocks": blocks, "mean_block_ms": sum(report["block_ms"]) / blocks}
    if o.reference:
        with stage("reference pipeline (upstream semantics)"):
            expected = reference_stream(model, inputs, blocks, seed)
        stats = [error_stats(r.latents, e) for r, e in zip(results, expected)]
        report["reference"] = [s.as_dict() for s in stats]
        worst = max(s.rel_l2 if math.isfinite(s.rel_l2) else math.inf for s in stats)  # NaN: no comparison
        summary.update(worst_rel_l2=worst,
                       reference_match=all(passes(s, PIPELINE_TOLERANCE[precision]) for s in stats))
    frames = None
    if decoder is not None:
        frames = [r.frames for r in results]  # each block's, written in turn: the video is never copied whole
        report["stage_ms"] = [r.stage_ms for r in results]
        report["decode_ms"] = [r.stage_ms["decode"] for r in results]
        summary["video_frames"] = sum(int(f.shape[0]) for f in frames)
    report["summary"] = summary
    if out is not None:
        report = {**report, "inputs": stream_inputs(cfg, o, decoder is not None)}  # hashed only for a report written
        for flag, path in files.items():  # the files hashed must be the ones the stream read
            require_unchanged(path, read[flag], flag, "while the stream ran", "its report would name another file "
                              "than the one read; nothing was written, run again")
        with staged_dir(out, owned_stream_files, overwrite=o.overwrite, protect=list(files.values()),
                        what=OUTPUT) as staging:
            torch.save(torch.cat([r.latents.cpu() for r in results], dim=2), staging / "latents.pt")
            if frames is not None:
                write_mp4(frames, staging / "video.mp4")
            (staging / "report.json").write_text(json.dumps(json_values(report), indent=2, allow_nan=False))
        if frames is not None:
            logger.info("wrote %s: %d frames at %d fps", out / "video.mp4", summary["video_frames"], FPS)
    return report


def stream_inputs(cfg: WanConfig, o: StreamOptions, decoded: bool) -> dict[str, Any]:
    """What the stream was made from, for its report: the config's every field (a config file may share a
    preset's name), each checkpoint and actions file (path, size, sha256) or how it was made instead (seeded),
    so that a stream of random weights is never taken for one of real ones. The conditioning (the first frame's
    latent, the image context) is always seeded noise."""
    def source(path: str | Path | None, otherwise: str) -> dict[str, Any] | str:
        return otherwise if path is None else {"path": str(Path(path).resolve()), **file_digest(path)}
    return {"config": cfg.to_dict(), "weights": source(o.weights, f"random (seed {o.seed})"),
            "decoder": o.decoder_kind if decoded else None,
            "vae_weights": source(o.vae_weights, f"random (seed {o.seed})") if decoded else None,
            "actions": source(o.actions, f"synthetic (seed {o.seed})"),
            "conditioning": f"seeded noise (seed {o.seed})", "seed": o.seed}


def input_files(weights: str | Path | None, vae_weights: str | Path | None,
                actions: str | Path | None) -> dict[str, Path]:
    """The files a stream reads, by flag: hashed for its report, checked unchanged before it is written, and never
    held by its --out."""
    given = {"--weights": weights, "--vae-weights": vae_weights, "--actions": actions}
    return {flag: Path(path) for flag, path in given.items() if path is not None}


def stream_decoder(cfg: WanConfig, o: StreamOptions) -> DecoderStream:
    """The PyTorch video decoder (its two calls) in the stream's precision and device."""
    kind = GRAPH_KINDS[o.decoder_kind]
    with stage(f"build the video decoder ({kind.name})"):
        decoder = kind.build(cfg, precision_dtype(o.precision), o.device, o.vae_weights, o.seed)
    if o.weights is None or o.vae_weights is None:
        logger.warning("random %s weights: the video is noise (pass --weights and --vae-weights for the model's "
                       "frames)", "DiT and VAE" if o.weights is None and o.vae_weights is None else
                       "DiT" if o.weights is None else "VAE")
    logger.warning("the stream's conditioning (the first frame's latent and the image context) is seeded noise: "
                   "`wan-trt stream` takes no start image, so its frames show no scene of yours")
    return DecoderStream(*(TorchRunner(decoder, kind.spec.from_config(cfg, o.precision, call)) for call in CALLS))
