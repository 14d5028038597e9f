"""``wan-trt stream``: synthetic input through the static-cache runtime (the registry's ``torch-eager``
backend), optionally checked against the reference pipeline."""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from wan_trt.config import WanConfig
from wan_trt.engines.backends import RunnerSources, make_runner
from wan_trt.engines.runtime.runner import check_device
from wan_trt.engines.runtime.session import StreamingSession, stream_blocks
from wan_trt.errors import WanTrtError
from wan_trt.log import logger, stage
from wan_trt.model import build_model
from wan_trt.spec import PassSpec, precision_dtype
from wan_trt.rotary import MAX_STREAM_FRAMES
from wan_trt.stream import NoiseSource, max_stream_blocks, synthetic_stream
from wan_trt.validate.metrics import error_stats
from wan_trt.validate.stream import reference_stream

# rel-L2 allowed between the two pipelines: same model, same precision, different cache form
PIPELINE_TOLERANCE = {"fp32": 1e-4, "bf16": 3e-2, "fp16": 1e-2}


def check_stream_request(cfg: WanConfig, *, blocks: int, precision: str, device: str, weights: str | None,
                         out: Path | None) -> None:
    """Everything about a stream that can be known before the model is built: refuse it up front."""
    if isinstance(blocks, bool) or not isinstance(blocks, int) or blocks < 1:
        raise WanTrtError(f"--blocks: expected an int >= 1, got {blocks!r}")
    most = max_stream_blocks(cfg)
    if blocks > most:
        raise WanTrtError(f"--blocks {blocks}: a stream reaches {MAX_STREAM_FRAMES} latent frames, "
                          f"{most} blocks of {cfg.block_frames}; pass --blocks {most} or fewer")
    if precision not in PIPELINE_TOLERANCE:
        raise WanTrtError(f"--precision {precision!r}: expected one of {', '.join(PIPELINE_TOLERANCE)}")
    check_device(device)
    if weights is not None and not Path(weights).is_file():
        raise WanTrtError(f"--weights {weights}: no such file")
    if out is not None and out.exists() and not out.is_dir():
        raise WanTrtError(f"--out {out}: exists and is not a directory; pass a directory")


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
        out: write latents.pt and report.json here.
        backend: the registered backend that runs the passes.
    """

    blocks: int = 8
    precision: str = "fp32"
    device: str = "cpu"
    weights: str | None = None
    seed: int = 0
    reference: bool = False
    out: Path | None = None
    backend: str = "torch-eager"


def run_stream(cfg: WanConfig, options: StreamOptions) -> dict[str, Any]:
    """Stream ``options.blocks`` blocks; with ``options.reference`` also run the upstream-semantics pipeline.

    Every argument is checked before the model is built; nothing is written unless every block ran.
    """
    o = options
    blocks, precision, device, seed, out = o.blocks, o.precision, o.device, o.seed, o.out
    check_stream_request(cfg, blocks=blocks, precision=precision, device=device, weights=o.weights, out=out)
    with stage(f"build {cfg.name} ({precision}, {device})"):
        model = build_model(cfg, precision_dtype(precision), device, o.weights, seed)
    spec = PassSpec.from_config(cfg, precision)
    inputs = synthetic_stream(cfg, blocks, seed)
    sources = RunnerSources(spec, device, lambda ops="native": model)
    with stage(f"stream {blocks} blocks"), make_runner(o.backend, sources) as runner:
        results = stream_blocks(StreamingSession(runner, noise=NoiseSource(seed)), inputs, blocks)
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
        worst = max(s.rel_l2 for s in stats)
        summary.update(worst_rel_l2=worst, reference_match=worst <= PIPELINE_TOLERANCE[precision]
                       and all(s.non_finite == 0 for s in stats))
    report["summary"] = summary
    if out is not None:
        out.mkdir(parents=True, exist_ok=True)
        torch.save(torch.cat([r.latents.cpu() for r in results], dim=2), out / "latents.pt")
        (out / "report.json").write_text(json.dumps(report, indent=2))
    return report
