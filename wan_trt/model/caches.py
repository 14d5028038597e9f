"""The two KV-cache forms the model runs with.

Every attention that looks back in time (self-attention, mouse, keyboard) asks its
cache for the keys/values to attend over, given the current block's post-RoPE K/V:

    k_all, v_all, key_valid = cache.window(kind, layer, k, v)

* :class:`RollingCaches` - upstream semantics: per layer a buffer of
  ``local_attn_size`` frames, rolled and evicted in place with global/local end
  indices, attention over its last ``local_attn_size`` frames.
* :class:`StaticCaches` - the engine form (docs/DESIGN.md section 3): the previous
  ``P = local_attn_size - block`` frames come in as fixed-size tensors with a count of
  valid frames (right-aligned), the current K/V is appended, invalid keys are masked,
  and each layer's current K/V is collected as the pass's outputs. No state, no host sync.

Frame units: ``units`` tokens per frame along the sequence axis (H*W for
self-attention, 1 for the action attentions).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

import torch

Kind = Literal["self", "mouse", "keyboard"]


class RollingKV:
    """Upstream's in-place rolling cache of one attention of one layer.

    k, v: [batch, local_attn_size * units, H, D]; indices in tokens.
    """

    def __init__(self, batch: int, frames: int, units: int, heads: int, head_dim: int,
                 dtype: torch.dtype, device: torch.device):
        self.units = units
        self.k = torch.zeros(batch, frames * units, heads, head_dim, dtype=dtype, device=device)
        self.v = torch.zeros_like(self.k)
        self.global_end = 0
        self.local_end = 0

    def update(self, k: torch.Tensor, v: torch.Tensor, start_frame: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Write the block's k, v [batch, n, H, D] and return the attention window."""
        capacity = self.k.shape[1]
        new = k.shape[1]
        current_end = start_frame * self.units + new
        if current_end > self.global_end and new + self.local_end > capacity:
            evicted = new + self.local_end - capacity
            rolled = self.local_end - evicted
            self.k[:, :rolled] = self.k[:, evicted:evicted + rolled].clone()
            self.v[:, :rolled] = self.v[:, evicted:evicted + rolled].clone()
            local_end = self.local_end + current_end - self.global_end - evicted
        else:
            local_end = self.local_end + current_end - self.global_end
        self.k[:, local_end - new:local_end] = k
        self.v[:, local_end - new:local_end] = v
        self.global_end, self.local_end = current_end, local_end
        start = max(0, local_end - capacity)
        return self.k[:, start:local_end], self.v[:, start:local_end]


@dataclass
class RollingCaches:
    """Upstream-semantics caches for every layer; ``start_frame`` is set per pass."""

    self_kv: list[RollingKV]
    mouse_kv: dict[int, RollingKV]
    keyboard_kv: dict[int, RollingKV]
    start_frame: int = 0

    def segments(self, kind: Kind, layer: int):
        """Fused window attention needs the static form: None here (PyTorch attention is used)."""
        return None

    def window(self, kind: Kind, layer: int, k: torch.Tensor, v: torch.Tensor):
        cache = {"self": self.self_kv, "mouse": self.mouse_kv, "keyboard": self.keyboard_kv}[kind][layer]
        k_all, v_all = cache.update(k, v, self.start_frame)
        return k_all, v_all, None


@dataclass
class StaticCaches:
    """Fixed-capacity previous-frame caches as explicit tensors (one pass, no state).

    prev[kind][layer]: (k, v), each [batch, P * units, H, D]; ``valid_frames``: int32 [1] (how
    many of the P frames hold data; they sit at the end). The current K/V of each layer is
    collected in ``current[kind][layer]``.
    """

    prev: dict[str, dict[int, tuple[torch.Tensor, torch.Tensor]]]
    valid_frames: torch.Tensor
    prev_frames: int
    units: dict[str, int]
    current: dict[str, dict[int, tuple[torch.Tensor, torch.Tensor]]] = field(default_factory=dict)
    masks: dict[str, torch.Tensor] = field(default_factory=dict)

    def segments(self, kind: Kind, layer: int):
        """(k_prev, v_prev, valid_frames, P, units) of ``layer`` for fused window attention; None when P = 0."""
        if self.prev_frames == 0:
            return None
        return (*self.prev[kind][layer], self.valid_frames, self.prev_frames, self.units[kind])

    def record(self, kind: Kind, layer: int, k: torch.Tensor, v: torch.Tensor) -> None:
        """Collect a layer's current K/V (the pass's outputs) without building its window."""
        self.current.setdefault(kind, {})[layer] = (k, v)

    def window(self, kind: Kind, layer: int, k: torch.Tensor, v: torch.Tensor):
        self.record(kind, layer, k, v)
        if self.prev_frames == 0:
            return k, v, None
        prev_k, prev_v = self.prev[kind][layer]
        return torch.cat([prev_k, k], dim=1), torch.cat([prev_v, v], dim=1), self.key_valid(kind, k)

    def key_valid(self, kind: str, k: torch.Tensor) -> torch.Tensor:
        """[P*units + F*units] bool: invalid previous slots first, then valid ones and the block (once per kind)."""
        if kind not in self.masks:
            units, prev = self.units[kind], self.prev_frames * self.units[kind]
            first_valid = (self.prev_frames - self.valid_frames.to(torch.int64)) * units  # [1]
            slots = torch.arange(prev, device=k.device)
            self.masks[kind] = torch.cat([slots >= first_valid.to(k.device),
                                          torch.ones(k.shape[1], dtype=torch.bool, device=k.device)])
        return self.masks[kind]
