"""Multi-block check: a backend's static-cache stream against the upstream-semantics reference pipeline."""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from wan_trt.engines.runtime.cublas_workspace import prefer_workspace_free_gemms
from wan_trt.engines.runtime.runner import Runner
from wan_trt.engines.runtime.session import StreamingSession, stream_blocks
from wan_trt.model.transformer import CausalWanModel
from wan_trt.pipeline import ReferencePipeline
from wan_trt.stream import NoiseSource, StreamInputs, synthetic_stream
from wan_trt.validate.metrics import ErrorStats, error_stats


@dataclass
class StreamReport:
    """Per-block errors of a stream against the reference and the stream's own timings."""

    backend: str
    blocks: list[ErrorStats]
    block_seconds: list[float]

    @property
    def worst(self) -> ErrorStats:
        return max(self.blocks, key=lambda s: (s.non_finite + s.reference_non_finite,
                                               s.rel_l2 if math.isfinite(s.rel_l2) else math.inf))

    def as_dict(self) -> dict:
        return {"backend": self.backend, "blocks": [b.as_dict() for b in self.blocks],
                "block_seconds": self.block_seconds, "worst": self.worst.as_dict()}


def reference_stream(model: CausalWanModel, inputs: StreamInputs, blocks: int, seed: int, *,
                     start_block: int = 0) -> list[torch.Tensor]:
    """Latents of blocks ``start_block`` .. ``start_block + blocks - 1`` from the upstream-semantics pipeline."""
    return list(ReferencePipeline(model).run(inputs, blocks, NoiseSource(seed), start_block=start_block))


def compare_stream(reference: CausalWanModel, runner: Runner, blocks: int, seed: int = 0,
                   inputs: StreamInputs | None = None, *, start_block: int = 0,
                   expected: list[torch.Tensor] | None = None) -> StreamReport:
    """Stream ``blocks`` blocks through ``runner`` and through the reference; compare block by block.

    Both draw the same noise and start at block ``start_block`` (absolute RoPE position, empty
    caches); ``inputs`` default to :func:`synthetic_stream` (seeded) for those blocks; ``expected``: the
    reference's latents of these inputs, where the caller has them already.
    """
    prefer_workspace_free_gemms()  # before the reference's GEMMs, as the session would
    cfg = runner.spec.config
    inputs = inputs or synthetic_stream(cfg, blocks, seed, first_block=start_block)
    if expected is None:
        expected = reference_stream(reference, inputs, blocks, seed, start_block=start_block)
    with runner:
        results = stream_blocks(StreamingSession(runner, noise=NoiseSource(seed)), inputs, blocks,
                                start_block=start_block)
    stats = [error_stats(r.latents, e) for r, e in zip(results, expected)]
    return StreamReport(runner.name, stats, [r.seconds for r in results])
