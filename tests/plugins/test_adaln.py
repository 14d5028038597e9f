import pytest
import torch

from wan_trt.errors import WanTrtError
from wan_trt.plugins.adaln import adaln, add_adaln, reference_adaln, reference_add_adaln
from tests.conftest import assert_close

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
DTYPES = [torch.float32, torch.float16, torch.bfloat16]  # no tl.dot: the interpreter computes bf16 right
TOL = {torch.float32: 1e-5, torch.float16: 4e-3, torch.bfloat16: 3e-2}


def _inputs(dtype, batch, frames, tokens, width, broadcast, seed):
    gen = torch.Generator().manual_seed(seed)
    def r(*shape, scale=1.0, shift=0.0):
        return (shift + scale * torch.randn(*shape, generator=gen)).to(DEVICE, dtype)
    mod = (width,) if broadcast else (batch, frames, 1, width)
    return (r(batch, frames * tokens, width, scale=3), r(batch, frames * tokens, width), r(*mod, scale=0.1),
            r(*mod, scale=0.1, shift=1), r(*mod))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("batch, frames, tokens, width, broadcast", [
    (1, 3, 6, 64, False), (2, 3, 5, 100, False), (1, 1, 7, 1536, False), (1, 3, 4, 96, True)])
def test_adaln_matches_reference(dtype, batch, frames, tokens, width, broadcast):
    x, y, g, a, c = _inputs(dtype, batch, frames, tokens, width, broadcast, width)
    assert_close(adaln(x, a, c, frames, 1e-6), reference_adaln(x.float(), a.float(), c.float(), frames, 1e-6),
                 atol=TOL[dtype], rtol=TOL[dtype], what=f"adaln {dtype}")
    x_new, h = add_adaln(x, y, g, a, c, frames, 1e-6)
    x_ref, h_ref = reference_add_adaln(x, y, g, a, c, frames, 1e-6)
    assert_close(x_new, x_ref, atol=TOL[dtype], rtol=TOL[dtype], what=f"residual {dtype}")
    assert_close(h, h_ref, atol=TOL[dtype], rtol=TOL[dtype], what=f"add_adaln {dtype}")


def test_fp32_residual_with_fp16_modulation():
    """fp16 graphs keep the residual stream in fp32: x fp32 in and out, h in the modulation's fp16."""
    x, y, g, a, c = _inputs(torch.float32, 1, 3, 6, 64, False, 0)
    x_new, h = add_adaln(x, y.half(), g.half(), a.half(), c.half(), 3, 1e-6, torch.float16)
    assert x_new.dtype == torch.float32 and h.dtype == torch.float16
    x_ref, h_ref = reference_add_adaln(x, y.half(), g.half(), a.half(), c.half(), 3, 1e-6, torch.float16)
    assert_close(x_new, x_ref, atol=1e-5, what="fp32 residual")
    assert_close(h, h_ref, atol=4e-3, what="fp16 h")


def test_limits():
    x = torch.randn(1, 10, 8, device=DEVICE)
    with pytest.raises(WanTrtError, match="do not split into 3 frames"):
        adaln(x, x[0, :1], x[0, :1], 3, 1e-6)
    with pytest.raises(WanTrtError, match="must be contiguous"):
        adaln(x.transpose(1, 2).contiguous().transpose(1, 2), x[0, 0], x[0, 0], 2, 1e-6)
