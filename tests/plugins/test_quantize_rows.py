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
    assert_close(s, rs, atol=0.0, rtol=1e-6, what="scales")
    if not gelu:  # the same IEEE division, the same rounding: bit-equal
        assert torch.equal(q.float(), rq.float())
    else:  # GELU's tanh by exp here, by tanh there: at most one e4m3 step (2^-3 relative) apart
        assert_close(q.float(), rq.float(), atol=2.0 ** -9 * 448, rtol=2.0 ** -3, what="quantized")
        assert float((q.float() != rq.float()).float().mean()) < 0.01


def test_quantize_rows_fp8_refuses_a_strided_input():
    x = torch.randn(8, 16, device=DEVICE).t()
    with pytest.raises(Exception, match="contiguous"):
        quantize_rows_fp8(x, False)
