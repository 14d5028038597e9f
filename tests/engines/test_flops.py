"""FLOPs of a graph, counted on the meta device, and what bench makes of them."""
import json

import pytest
import torch
from click.testing import CliRunner
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.utils.flop_counter import FlopCounterMode

from wan_trt.cli import main
from wan_trt.config_load import load_config
from wan_trt.decoder_spec import DecoderSpec
from wan_trt.engines.flops import H100_DENSE_BF16_TFLOPS, graph_flops
from wan_trt.graphs import graph_kind
from wan_trt.info import flops_per_pass
from wan_trt.model import build_model
from wan_trt.spec import PassSpec


def _counted_on_cpu(spec, seed=0):
    """The real module with drawn weights, on real sample inputs (attention by its math form: the counter
    has no formula for the CPU's fused attention kernel)."""
    kind = graph_kind(spec)
    module = kind.build(spec.config, torch.float32, "cpu", None, seed)
    feeds = kind.sample_inputs(module, spec, seed)
    with FlopCounterMode(display=False) as counter, torch.no_grad(), sdpa_kernel(SDPBackend.MATH):
        kind.static(module, spec)(*(feeds[n] for n in spec.input_names))
    return float(counter.get_total_flops())


@pytest.mark.parametrize("spec", [PassSpec.from_config(load_config("universal-small"), "fp32"),
                                  DecoderSpec.from_config(load_config("universal-small"), "fp32", "steady")],
                         ids=["pass", "decoder"])
def test_the_meta_count_is_the_real_modules(spec):
    flops = graph_flops(spec)
    assert flops > 0 and flops == _counted_on_cpu(spec)


@pytest.mark.parametrize("name", ["universal", "gta_drive", "templerun-small"])
def test_the_count_of_a_pass_equals_the_analytic_one(name):
    """`wan-trt info` counts a pass's FLOPs from the config by formula (10.2 TFLOP for universal);
    the counter, from the module, must find the same."""
    cfg = load_config(name)
    assert graph_flops(PassSpec.from_config(cfg, "bf16")) == flops_per_pass(cfg)["total"]


def test_a_meta_model_has_the_real_ones_parameters_and_draws_nothing():
    cfg = load_config("universal-small")
    meta, real = build_model(cfg, torch.bfloat16, "meta"), build_model(cfg, torch.bfloat16, "cpu")
    assert {n: (p.shape, p.dtype) for n, p in meta.named_parameters()} == \
        {n: (p.shape, p.dtype) for n, p in real.named_parameters()}
    assert all(p.is_meta for p in meta.parameters())


def test_bench_rows_carry_tflops_and_the_fraction_of_the_dense_peak(plain_export, tmp_path):
    out = tmp_path / "bench.json"
    res = CliRunner().invoke(main, ["bench", str(plain_export), "--device", "cpu", "--blocks", "2",
                                    "--backends", "torch-eager", "--out", str(out)])
    assert res.exit_code == 0, res.output
    report = json.loads(out.read_text())
    spec = PassSpec.from_config(load_config("universal-small"), "fp32")
    assert report["flops_per_block"] == report["passes_per_block"] * _counted_on_cpu(spec)
    row = report["backends"]["torch-eager"]
    assert row["tflops"] == pytest.approx(report["flops_per_block"] / row["block_ms"]["p50"] / 1e9)
    assert row["dense_bf16_fraction"] == pytest.approx(row["tflops"] / H100_DENSE_BF16_TFLOPS)
    assert "TFLOP/s" in res.output and "of dense bf16" in res.output
