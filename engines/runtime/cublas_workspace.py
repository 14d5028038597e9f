"""GEMMs without a cuBLASLt workspace: the kernels an AOTInductor engine's CUDA graphs run fastest.

Given a workspace, cuBLASLt runs two of the DiT's GEMMs (the FFN's up-projection with its GELU epilogue, the
context projection) as kernel variants that use it, with a memset before every call. In a CUDA graph the
kernel after a memset starts about 5 us after it, where one kernel after another waits 0.5 us: on an H100
those are 124 of a universal block's 244 memsets (the rest are cuDNN's attention). Given none, cuBLASLt
takes the same tiles as its stream-scheduled variant, with no memset: the up-projection 12.71 ms a block
instead of 13.07, the idle time after memsets 0.64 ms instead of 1.21; a block 81.50 against 82.08 ms p50 in
runs alternating on one engine, at the edge of what such runs tell apart
(bench/results/ab_cublaslt_workspace_universal_bf16_h100.json).

PyTorch reads ``CUBLASLT_WORKSPACE_SIZE`` (KiB) once, at the process's first cuBLASLt GEMM, so this takes
effect only before any: ``wan-trt`` asks at its start, bench, check and the stream comparison when called,
a :class:`StreamingSession` when it is made (too late where the process ran GEMMs before, e.g. a CLIP
encoder: call :func:`prefer_workspace_free_gemms` first thing), the C++ runtime's session likewise. A value
already in the environment is kept: setting the variable yourself (the workspace size you want, in KiB)
opts out.
"""
from __future__ import annotations

import os

VARIABLE = "CUBLASLT_WORKSPACE_SIZE"


def prefer_workspace_free_gemms() -> str:
    """Ask for no cuBLASLt workspace unless the environment names a size already; returns the size asked for
    (KiB, as the variable says it)."""
    return os.environ.setdefault(VARIABLE, "0")
