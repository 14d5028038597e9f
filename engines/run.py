"""``wan-trt stream``: synthetic input through the static-cache runtime, optionally checked."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch

from wan_trt.config import WanConfig
from wan_trt.engines.session import StreamingSession, stream_blocks
from wan_trt.engines.torch_runner import TorchRunner
from wan_trt.log import logger, stage
from wan_trt.model import build_model
from wan_trt.spec import PassSpec, precision_dtype
from wan_trt.stream import NoiseSource, synthetic_stream

# rel-L2 allowed between the two pipelines: same model, same precision, different cache form
PIPELINE_TOLERANCE = {"fp32": 1e-4, "bf16": 3e-2, "fp16": 1e-2}


def run_stream(cfg: WanConfig, blocks: int, precision: str = "fp32", device: str = "cpu",
               weights: str | None = None, seed: int = 0, reference: bool = False,
               out: Path | None = None) -> dict[str, Any]:
    """Stream ``blocks`` blocks; with ``reference`` also run the upstream-semantics pipeline."""
    from wan_trt.validate.metrics import error_stats
    from wan_trt.validate.stream import reference_stream

    with stage(f"build {cfg.name} ({precision}, {device})"):
        model = build_model(cfg, precision_dtype(precision), device, weights, seed)
    spec = PassSpec.from_config(cfg, precision)
    inputs = synthetic_stream(cfg, blocks, seed)
    with stage(f"stream {blocks} blocks"), TorchRunner(model, spec) as runner:
        results = stream_blocks(StreamingSession(runner, noise=NoiseSource(seed)), inputs, blocks)
    for r in results:
        logger.info("block %d (frame %d): %.1f ms", r.index, r.start_frame, 1e3 * r.seconds)
    report: dict[str, Any] = {"config": cfg.name, "precision": precision, "device": device,
                              "block_ms": [1e3 * r.seconds for r in results]}
    summary = {"blocks": blocks, "mean_block_ms": sum(report["block_ms"]) / blocks}
    if reference:
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
