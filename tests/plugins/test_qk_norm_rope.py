import pytest
import torch

from wan_trt.errors import WanTrtError
from wan_trt.plugins.qk_norm_rope import qk_norm_rope, reference_qk_norm_rope
from wan_trt.plugins.window_attention import INTERPRET
from tests.conftest import assert_close

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
DTYPES = [torch.float32, torch.float16] + ([] if INTERPRET else [torch.bfloat16])
TOL = {torch.float32: 1e-5, torch.float16: 2e-3, torch.bfloat16: 2e-2}


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("batch, length, heads, head_dim", [(1, 18, 2, 32), (2, 7, 3, 16), (1, 30, 12, 128),
                                                            (1, 5, 5, 64)])
def test_matches_reference(dtype, batch, length, heads, head_dim):
    gen = torch.Generator().manual_seed(length)
    c = heads * head_dim
    q, k = (torch.randn(batch, length, c, generator=gen).to(DEVICE, dtype) for _ in range(2))
    wq, wk = ((1 + 0.1 * torch.randn(c, generator=gen)).to(DEVICE, dtype) for _ in range(2))
    ang = torch.randn(length, head_dim // 2, generator=gen).to(DEVICE) * 10
    out = qk_norm_rope(q, k, wq, wk, ang.cos(), ang.sin(), 1e-6)
    ref = reference_qk_norm_rope(q.float(), k.float(), wq.float(), wk.float(), ang.cos(), ang.sin(), 1e-6)
    for o, r, name in zip(out, ref, "qk"):
        assert o.dtype == dtype
        assert_close(o, r, atol=TOL[dtype], rtol=TOL[dtype], what=f"{name} {dtype}")


def test_matches_the_models_norm_and_rope():
    """Same numbers as WanRMSNorm + apply_rope, the unfused path of the model."""
    from wan_trt.model.layers import WanRMSNorm
    from wan_trt.model.rope import apply_rope
    norm = WanRMSNorm(64, eps=1e-6).to(DEVICE)
    torch.nn.init.normal_(norm.weight, 1.0, 0.1)
    x = torch.randn(1, 9, 64, device=DEVICE)
    ang = torch.randn(9, 16, device=DEVICE)
    unfused = apply_rope(norm(x).unflatten(-1, (2, 32)), ang.cos()[:, None], ang.sin()[:, None]).flatten(-2)
    fused, _ = qk_norm_rope(x, x, norm.weight, norm.weight, ang.cos(), ang.sin(), 1e-6)
    assert_close(fused, unfused, atol=1e-5, what="fused vs model")


def test_limits():
    x = torch.randn(1, 4, 64, device=DEVICE)
    ang = torch.randn(4, 16, device=DEVICE)
    with pytest.raises(WanTrtError, match="cos/sin"):
        qk_norm_rope(x, x, x[0, 0], x[0, 0], ang.double(), ang.sin(), 1e-6)
    with pytest.raises(WanTrtError, match="weights"):
        qk_norm_rope(x, x, x[0, 0, :10], x[0, 0], ang.cos(), ang.sin(), 1e-6)
