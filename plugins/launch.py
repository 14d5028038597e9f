"""Launch settings of the fused kernels: one place for block sizes, warps and pipeline stages, read
by the Python launchers and by the TensorRT ahead-of-time plans alike (so an engine launches a
kernel exactly as the launcher does). Plain Python: importable without Triton.

    row kernels (one program per row of n elements):  block = next power of two >= n,
                                                      4 warps up to 1024 elements, else 8; 1 stage
    multi-row kernels (the decoder's norm):           rows of n (padded to a power of two) x as many
                                                      rows as make 4096 values a tile (2048 above 128
                                                      channels), all of one frame; 2 warps, 1 stage
    window attention:                                 one of the tilings below (autotuned on a GPU,
                                                      TensorRT tactics in an engine)
    few-key attention (a loop over the keys):         a block of queries x every head per program,
                                                      about 4096 values a tile; 4 warps, 1 stage
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from typing import NamedTuple

from wan_trt.errors import WanTrtError

# Without a GPU the kernels run through Triton's interpreter (set before the kernel modules load).
INTERPRET = os.environ.get("TRITON_INTERPRET") == "1"


@dataclass(frozen=True)
class Launch:
    """How one kernel is launched: its block-size constexprs, warps and software-pipeline stages."""
    blocks: dict[str, int]  # e.g. {"BLOCK_C": 2048}
    num_warps: int
    num_stages: int

    def kwargs(self) -> dict[str, int]:
        """The keyword arguments of a Triton launch (``kernel[grid](..., **launch.kwargs())``)."""
        return {**self.blocks, "num_warps": self.num_warps, "num_stages": self.num_stages}


def next_power_of_two(n: int) -> int:
    """The smallest power of two >= n (1 for n <= 1), as triton.next_power_of_2."""
    return 1 << max(n - 1, 0).bit_length()


def row_launch(block_name: str, n: int) -> Launch:
    """Settings of a kernel that reduces one row of ``n`` elements per program (Liger's
    ``calculate_settings``): the row padded to a power of two, more warps for long rows."""
    block = next_power_of_two(n)
    return Launch({block_name: block}, num_warps=4 if block <= 1024 else 8, num_stages=1)


def rows_launch(n: int, frame_rows: int) -> Launch:
    """Settings of a kernel that normalises ``BLOCK_R`` rows of ``n`` elements per program, no program's rows
    straddling two frames of ``frame_rows`` rows (BLOCK_R divides it): 4096 values a tile up to 128 channels, 2048
    above, 2 warps. Measured on an H200 at a steady block's decoder norms: of 2, 4 and 8 warps and 2048-8192 values
    tried on the plain norm's calls, these were the fastest or within 6 % at every shape (an experiment whose file
    is not kept; bench/results/decoder_norms_h200.json times every call under these and 2048 / 4096 values)."""
    block = next_power_of_two(n)
    rows = max(1, (4096 if block <= 128 else 2048) // block)
    if frame_rows > 0:  # an empty frame launches no program
        rows = min(rows, frame_rows & -frame_rows)  # the largest power of two dividing frame_rows
    return Launch({"BLOCK_R": rows, "BLOCK_C": block}, num_warps=2, num_stages=1)


class Tiling(NamedTuple):
    block_m: int  # query rows per program
    block_n: int  # keys per whole block
    warps: int
    stages: int  # software-pipeline depth of the K/V loads
    tail: int  # keys per masked block after a segment's last whole block (<= block_n)


# GPU tilings of window attention, autotuned; also the TensorRT tactics. Measured on the H100
# (bench/results/kernels_universal_bf16_h100_*.json): 256x64 with 16 warps is fastest there, and
# narrower tail blocks take 1.5 % off with every previous frame valid (each segment then ends 16 keys
# past a 64-key block).
GPU_TILINGS = (Tiling(256, 64, 16, 3, 32), Tiling(256, 64, 16, 4, 16), Tiling(128, 128, 8, 3, 32),
               Tiling(64, 64, 4, 3, 16))
# One small tiling under the interpreter: it is slow.
INTERPRETER_TILINGS = (Tiling(32, 32, 4, 1, 16),)


def tiling_launch(t: Tiling) -> Launch:
    """The launch of a window-attention tiling; its sizes must be powers of two of at least 16
    (tl.dot's limit), the tail no wider than a whole block."""
    sizes = (t.block_m, t.block_n, t.tail)
    if any(n < 16 or n & (n - 1) for n in sizes) or t.tail > t.block_n:
        raise WanTrtError(f"window_attention: tiling {t}: block_m, block_n and tail must be powers of two "
                          f">= 16, with tail <= block_n")
    return Launch({"BLOCK_M": t.block_m, "BLOCK_N": t.block_n, "TAIL_N": t.tail}, num_warps=t.warps,
                  num_stages=t.stages)


MAX_FEW_KEYS = 64  # few-key attention unrolls its loop over the keys


def few_key_launch(lq: int, heads: int, head_dim: int) -> Launch:
    """Few-key attention: ``BLOCK_M`` queries x all heads (``BLOCK_H``, padded to a power of two) x
    ``head_dim`` per program, about 4096 fp32 values per running tile (32 per thread of 4 warps)."""
    block_h = next_power_of_two(heads)
    block_m = max(1, min(next_power_of_two(lq), 16, 4096 // (block_h * head_dim)))
    return Launch({"BLOCK_M": block_m, "BLOCK_H": block_h}, num_warps=4, num_stages=1)
