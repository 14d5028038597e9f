"""Finiteness checks of a stream: which tensor first holds NaN/Inf, and the error for a block
that came out non-finite (refused by the session without being committed)."""
from __future__ import annotations

import torch

from wan_trt.errors import WanTrtError


class NonFiniteBlock(WanTrtError):
    """A block whose latents or new cache entries came out NaN/Inf; it was not committed.

    ``block`` is its index and ``tensor`` the first non-finite one (``latents``, ``self_k_cur_00``...).
    """

    def __init__(self, message: str, *, block: int, tensor: str):
        super().__init__(message)
        self.block, self.tensor = block, tensor


class NonFiniteFrames(WanTrtError):
    """A decode whose frames came out NaN/Inf; the decoder's histories were not carried on."""


def first_non_finite(tensors: dict[str, torch.Tensor]) -> str | None:
    """Name of the first tensor holding NaN or Inf, or None: one device sync.

    One multi-tensor reduction per dtype reads each tensor once for its largest magnitude
    (``_foreach_norm`` of order inf, in the tensor's own dtype: NaN propagates into it, +-Inf becomes it,
    a finite float64 stays finite, a complex tensor gives its modulus), with no tensor-sized intermediate
    and a few launches for any number of tensors: a DiT pass has a K and a V output per cache layer, 121
    tensors with the latents (its cost: bench/results/block_end_universal_bf16_h100.json).
    """
    # an empty or integer tensor holds nothing non-finite
    names = [name for name, t in tensors.items() if t.numel() and (t.is_floating_point() or t.is_complex())]
    if not names:
        return None
    largest = {}  # per dtype: each tensor's largest magnitude in its own dtype (float64 beyond fp32 stays finite)
    for dtype in {tensors[n].dtype for n in names}:
        group = [n for n in names if tensors[n].dtype == dtype]
        largest.update(zip(group, torch._foreach_norm([tensors[n] for n in group], float("inf"))))
    finite = torch.stack([torch.isfinite(largest[n]).to(tensors[names[0]].device) for n in names]).tolist()
    return next((name for name, ok in zip(names, finite) if not ok), None)


def largest_magnitudes(tensors: list[torch.Tensor]) -> torch.Tensor:
    """Each tensor's largest magnitude, fp32 [len(tensors)] on the first one's device (NaN where a
    tensor holds a NaN, Inf where it holds an Inf); no sync."""
    largest = torch._foreach_norm(tensors, float("inf"), dtype=torch.float32)
    device = largest[0].device
    return torch.stack([m.to(device) for m in largest])


def first_flagged(names: list[str], largest: torch.Tensor) -> str | None:
    """The first of ``names`` whose :func:`largest_magnitudes` entry is not finite, or None (one sync)."""
    finite = torch.isfinite(largest).tolist()
    return next((name for name, ok in zip(names, finite) if not ok), None)
