"""Error statistics of an output against its fp32 reference, and the pass/fail policy.

Policy: compare against an fp32 PyTorch reference; an output passes when its relative L2
error is at most ``factor`` (2) times that of the PyTorch model in the graph's precision
on the same inputs (the yardstick), with a floor that depends on the precision, and it
holds no NaN/Inf. No allowance exceeds MAX_ALLOWED_REL_L2 (a yardstick that far off fp32 is broken itself).

The floor is what a correct graph of that precision can always reach. For fp32 the
yardstick is the reference itself (error 0), so the floor is the whole tolerance: a
correct fp32 graph differs from fp32 PyTorch only by the order of its roundings
(rel-L2 2.5e-7 to 3.9e-7 measured on the small configs, ONNX Runtime and AOTInductor on
CPU), so 1e-5 leaves 25x headroom and still catches a single corrupt weight row. For
bf16/fp16 the floor (1e-3) only matters where the yardstick's own error is tiny.
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass

import torch

REL_L2_FLOORS = {"fp32": 1e-5, "fp16": 1e-3, "bf16": 1e-3, "fp8": 1e-3}
FACTOR = 2.0
# No allowance reaches this: an output of zeros is 100 % off, and a yardstick 12.5 % or more off fp32 is broken
# itself (a correct bf16 model is about 1.6 % off), so it lends no allowance beyond this cap.
MAX_ALLOWED_REL_L2 = 0.25


@dataclass(frozen=True)
class ErrorStats:
    """``non_finite``: NaN/Inf values of the compared output; ``reference_non_finite``: of its reference.
    Where either is non-zero the error statistics are NaN: nothing is forgiven as a zero."""
    max_abs: float
    mean_abs: float
    rel_l2: float
    cosine: float
    non_finite: int
    reference_non_finite: int = 0

    def as_dict(self) -> dict[str, float]:
        return asdict(self)


def error_stats(actual, reference) -> ErrorStats:
    """Statistics of ``actual - reference`` (tensors or NumPy arrays) computed in float64 on the CPU."""
    a, r = (torch.as_tensor(t).detach().to("cpu", torch.float64) for t in (actual, reference))
    if a.shape != r.shape:  # the shapes, not the sizes: a transposed output holds as many values
        raise ValueError(f"shape mismatch: {tuple(a.shape)} vs {tuple(r.shape)}")
    a, r = a.flatten(), r.flatten()
    non_finite, reference_non_finite = (int((~torch.isfinite(t)).sum()) for t in (a, r))
    if non_finite or reference_non_finite:
        nan = float("nan")
        return ErrorStats(nan, nan, nan, nan, non_finite, reference_non_finite)
    diff = a - r
    r_norm = float(r.norm())
    denom = float(a.norm()) * r_norm
    return ErrorStats(
        max_abs=float(diff.abs().max()) if diff.numel() else 0.0,
        mean_abs=float(diff.abs().mean()) if diff.numel() else 0.0,
        rel_l2=float(diff.norm()) / r_norm if r_norm > 0 else float(diff.norm()),
        cosine=float(a @ r) / denom if denom > 0 else float(bool(a.any()) == bool(r.any())),  # a zero side: 0
        non_finite=non_finite,
    )


def rel_l2_floor(precision: str) -> float:
    """The smallest tolerance for a graph of ``precision`` ('bf16' | 'fp16' | 'fp32')."""
    if precision not in REL_L2_FLOORS:
        raise ValueError(f"no accuracy policy for precision {precision!r}")
    return REL_L2_FLOORS[precision]


def tolerance(baseline_rel_l2: float, precision: str, factor: float = FACTOR) -> float:
    """Allowed relative L2 given the yardstick's (the PyTorch model in ``precision``) own error; NaN (no
    allowance: nothing passes) where that error is not a finite number."""
    if not math.isfinite(baseline_rel_l2):
        return float("nan")
    return min(max(factor * baseline_rel_l2, rel_l2_floor(precision)), MAX_ALLOWED_REL_L2)


def passes(stats: ErrorStats, allowed_rel_l2: float) -> bool:
    """Both sides finite, a finite allowance, and the error within it."""
    return (stats.non_finite == 0 and stats.reference_non_finite == 0 and math.isfinite(allowed_rel_l2)
            and stats.rel_l2 <= allowed_rel_l2)
