"""GEMMs without a cuBLASLt workspace: the kernels an engine's CUDA graphs run fastest.

Given a workspace, cuBLASLt runs some of the DiT's GEMMs (the FFN's up-projection with its GELU epilogue, the
context projection) as cooperative kernels that zero a flag in the workspace with a memset before every call.
In a CUDA graph the kernel after a memset starts about 5 us after it, where one kernel after another waits
0.5 us: on an H100 a universal block ran 244 memsets and sat idle 1.2 ms after them. Given none, cuBLASLt
takes the same tiles with stream scheduling and no memset (the up-projection 12.71 ms a block instead of
13.07; a block 81.50 against 82.08 ms p50 in runs alternating on one engine:
bench/results/ab_cublaslt_workspace_universal_bf16_h100.json).

PyTorch reads ``CUBLASLT_WORKSPACE_SIZE`` (KiB) once, at the process's first cuBLASLt GEMM, so this takes
effect only before any: ``wan-trt`` asks at its start, a :class:`StreamingSession` when it is made (too late
where the process ran GEMMs before, e.g. a CLIP encoder: call :func:`prefer_workspace_free_gemms` first
thing), the C++ runtime's session likewise. A value already in the environment is kept: setting the variable
yourself (the workspace size you want, in KiB) opts out.
"""
from __future__ import annotations

import os

VARIABLE = "CUBLASLT_WORKSPACE_SIZE"


def prefer_workspace_free_gemms() -> str:
    """Ask for no cuBLASLt workspace unless the environment names a size already; returns the size asked for
    (KiB, as the variable says it)."""
    return os.environ.setdefault(VARIABLE, "0")
