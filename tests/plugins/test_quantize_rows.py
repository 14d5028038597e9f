"""The fp8 precision's per-row quantization kernel (with and without the FFN's GELU) against its reference."""
from __future__ import annotations

import pytest
import torch

from tests.conftest import assert_close
from wan_trt.plugins.quantize_rows import quantize_rows_fp8, reference_quantize_rows_fp8

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"  # cpu: Triton's interpreter (tests/conftest.py)


@pytest.mark.parametrize("shape", [(5, 37), (2, 3, 130), (1, 1536), (3, 8960)])
@pytest.mark.parametrize("gelu", [False, True], ids=["rows", "gelu"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_quantize_rows_fp8_matches_the_reference(shape, gelu, dtype):
    gen = torch.Generator().manual_seed(sum(shape))
    x = (torch.randn(shape, generator=gen) * 3).to(DEVICE, dtype)
    x[..., 1] = 0.0
    q, s = quantize_rows_fp8(x, gelu)
    rq, rs = reference_quantize_rows_fp8(x, gelu)
    assert q.dtype == rq.dtype and q.shape == rq.shape and s.shape == rs.shape
    assert torch.equal(s, rs)  # IEEE divisions both: bit-equal
    if not gelu:  # the same IEEE division, the same rounding: bit-equal
        assert torch.equal(q.float(), rq.float())
    else:  # GELU's tanh by exp here, by tanh there: at most one e4m3 step (2^-3 relative) apart
        assert_close(q.float(), rq.float(), atol=2.0 ** -9 * 448, rtol=2.0 ** -3, what="quantized")
        assert float((q.float() != rq.float()).float().mean()) < 0.01


def test_quantize_rows_fp8_refuses_a_strided_input():
    x = torch.randn(8, 16, device=DEVICE).t()
    with pytest.raises(Exception, match="contiguous"):
        quantize_rows_fp8(x, False)


def test_quantize_rows_fp8_rounds_ties_carries_and_subnormals_as_the_reference():
    """A row whose amax is 448 (scale 1): every midpoint between e4m3 neighbours (ties to even, carries
    into the next binade), one step either side, and e4m3's subnormals, of both signs."""
    grid = torch.arange(256, dtype=torch.uint8).view(torch.float8_e4m3fn).float()
    grid = grid[torch.isfinite(grid) & (grid >= 0)].unique()
    mid = (grid[1:] + grid[:-1]) / 2
    values = torch.cat([grid, mid, mid.nextafter(torch.tensor(0.0)), mid.nextafter(torch.tensor(1e9)),
                        torch.tensor([2.0 ** -10, 3 * 2.0 ** -11])])
    x = torch.cat([values, -values]).reshape(1, -1).to(DEVICE)
    q, s = quantize_rows_fp8(x, False)
    rq, rs = reference_quantize_rows_fp8(x, False)
    assert float(s) == float(rs) == 1.0
    assert torch.equal(q.float(), rq.float()), (x[q.float() != rq.float()], q.float()[q.float() != rq.float()])


@pytest.mark.parametrize("gelu", [False, True], ids=["rows", "gelu"])
@pytest.mark.parametrize("bad", [float("nan"), float("inf"), float("-inf")])
def test_quantize_rows_fp8_keeps_a_non_finite_row_non_finite(bad, gelu):
    x = torch.randn(3, 40, device=DEVICE)
    x[1, 7] = bad
    q, s = quantize_rows_fp8(x, gelu)
    rq, rs = reference_quantize_rows_fp8(x, gelu)
    assert not bool(torch.isfinite(s[1]).all())
    if gelu:  # GELU's tanh by exp here, by tanh there
        assert_close(s[[0, 2]], rs[[0, 2]], atol=0, rtol=1e-6, what="scale")
    else:
        assert torch.equal(s[[0, 2]], rs[[0, 2]]) and torch.equal(q[[0, 2]].float(), rq[[0, 2]].float())
    if DEVICE == "cuda":  # Triton's interpreter casts NaN to a finite float8
        assert not bool(torch.isfinite(q[1].float()).all())


def test_quantize_rows_fp8_finds_a_gelu_rows_amax_below_the_negative_bound():
    """|gelu(x)| peaks at 0.170 for negative x (x = -0.75): in a row whose largest x is 0.1 (gelu 0.054)
    the amax is at a negative x; in one of small values only, at the largest x (0.15: gelu 0.084)."""
    row = torch.linspace(-3.0, 0.1, 301)
    x = torch.stack([row, -0.05 * row]).to(DEVICE)
    q, s = quantize_rows_fp8(x, True)
    rq, rs = reference_quantize_rows_fp8(x, True)
    assert_close(s, rs, atol=0, rtol=1e-6, what="scale")
    assert_close(q.float(), rq.float(), atol=2.0 ** -9 * 448, rtol=2.0 ** -3, what="quantized")
