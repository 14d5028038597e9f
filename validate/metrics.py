"""Error statistics of an output against its fp32 reference, and the pass/fail policy.

Policy (DESIGN.md section 4): compare against an fp32 PyTorch reference; an output
passes when its relative L2 error is at most ``factor`` (2) times that of the bf16
PyTorch model on the same inputs, with a floor, and it holds no NaN/Inf.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass

import torch

REL_L2_FLOOR = 1e-3
FACTOR = 2.0


@dataclass(frozen=True)
class ErrorStats:
    max_abs: float
    mean_abs: float
    rel_l2: float
    cosine: float
    non_finite: int

    def as_dict(self) -> dict[str, float]:
        return asdict(self)


def error_stats(actual, reference) -> ErrorStats:
    """Statistics of ``actual - reference`` (tensors or NumPy arrays) computed in float64 on the CPU."""
    a = torch.as_tensor(actual).detach().to("cpu", torch.float64).flatten()
    r = torch.as_tensor(reference).detach().to("cpu", torch.float64).flatten()
    if a.shape != r.shape:
        raise ValueError(f"shape mismatch: {tuple(actual.shape)} vs {tuple(reference.shape)}")
    non_finite = int((~torch.isfinite(a)).sum())
    a = torch.nan_to_num(a, nan=0.0, posinf=0.0, neginf=0.0)
    diff = a - r
    r_norm = float(r.norm())
    denom = float(a.norm()) * r_norm
    return ErrorStats(
        max_abs=float(diff.abs().max()) if diff.numel() else 0.0,
        mean_abs=float(diff.abs().mean()) if diff.numel() else 0.0,
        rel_l2=float(diff.norm()) / r_norm if r_norm > 0 else float(diff.norm()),
        cosine=float(a @ r) / denom if denom > 0 else 1.0,
        non_finite=non_finite,
    )


def tolerance(baseline_rel_l2: float, factor: float = FACTOR, floor: float = REL_L2_FLOOR) -> float:
    """Allowed relative L2 given the bf16 PyTorch model's own error."""
    return max(factor * baseline_rel_l2, floor)


def passes(stats: ErrorStats, allowed_rel_l2: float) -> bool:
    return stats.non_finite == 0 and stats.rel_l2 <= allowed_rel_l2
