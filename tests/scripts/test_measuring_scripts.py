"""The measuring scripts' own logic (their GPU runs are the measurements themselves)."""
from __future__ import annotations

import importlib.util
from pathlib import Path

SCRIPTS = Path(__file__).resolve().parents[2] / "scripts"


def load(name: str):
    spec = importlib.util.spec_from_file_location(name, SCRIPTS / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_block_timeline_sums_the_idle_time_after_each_kind_of_activity():
    timeline = load("block_kernels").timeline
    kernels = [(0, 10, "gemm"), (14, 20, "Memset"), (25, 30, "gemm"), (30, 40, "Memset"), (46, 50, "norm")]
    result = timeline(kernels)
    assert result["idle_after"] == [["Memset", 2, 0.011], ["gemm", 1, 0.004]]  # 5 + 6 us after memsets, 4 after a gemm
    assert result["idle_ms"] == 0.015


def test_gemm_shapes_records_every_gemm_of_a_pass_with_its_count():
    spec, rows = load("gemm_shapes").pass_gemms("universal", "bf16")  # shapes only: the meta device
    cfg = spec.config
    c, tokens = cfg.model.dim, cfg.tokens_per_block
    square = next(r for r in rows if r["op"] == "addmm" and r["shapes"] == [[c], [tokens, c], [c, c]])
    # q, k, v, o of the self-attention and q, o of the cross-attention, in every layer
    assert square["calls_per_pass"] == 6 * cfg.model.num_layers
    ffn = [r for r in rows if r["op"] == "addmm" and r["shapes"][2] in ([c, cfg.model.ffn_dim], [cfg.model.ffn_dim, c])]
    assert [r["calls_per_pass"] for r in ffn] == [cfg.model.num_layers] * 2


def test_a_gap_is_charged_to_the_activity_that_ended_last_before_it():
    # a copy overlaps the long kernel and ends first: the gap follows the kernel, which ends at 30
    result = load("block_kernels").timeline([(0, 30, "attention"), (5, 10, "copy"), (34, 40, "gemm")])
    assert result["idle_after"] == [["attention", 1, 0.004]]
