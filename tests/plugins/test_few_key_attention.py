import pytest
import torch

from wan_trt.errors import WanTrtError
from wan_trt.plugins.few_key_attention import few_key_attention, reference_few_key_attention
from tests.conftest import assert_close, attention_segments

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
DTYPES = [torch.float32, torch.float16, torch.bfloat16]  # no tl.dot: the interpreter computes bf16 right
TOL = {torch.float32: 1e-5, torch.float16: 2e-3, torch.bfloat16: 1e-2}
RTOL = {torch.float32: 0.0, torch.float16: 0.0, torch.bfloat16: 8e-3}  # bf16 output: its rounding scales with |x|


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("batch, lq, prev_frames, units, n_cur, heads, head_dim, valid", [
    (5, 3, 3, 1, 3, 2, 16, 3),    # the mouse path: per token 3 queries over 3 cached + 3 current keys
    (5, 3, 3, 1, 3, 2, 16, 0),    # first block: no valid previous frame
    (1, 37, 3, 1, 3, 3, 32, 2),   # the keyboard path: every token over the same keys, odd length
    (3, 21, 1, 2, 2, 1, 64, 1),   # P = 1 with 2 units per frame
    (2, 5, 2, 3, 4, 2, 8, 7),     # valid count beyond the window: every previous key
    (2, 19, 3, 1, 3, 2, 128, 2),  # head_dim 128: fewer queries per program
])
def test_matches_reference(dtype, batch, lq, prev_frames, units, n_cur, heads, head_dim, valid):
    q, kp, vp, kc, vc, valid_t = attention_segments(torch.Generator().manual_seed(lq + valid), batch, lq, n_cur,
                                                    prev_frames * units, heads, head_dim, valid, dtype, DEVICE)
    out = few_key_attention(q, kp, vp, kc, vc, valid_t, prev_frames, units)
    ref = reference_few_key_attention(q.float(), kp.float(), vp.float(), kc.float(), vc.float(), valid_t,
                                      prev_frames, units)
    assert out.dtype == dtype
    assert_close(out, ref, atol=TOL[dtype], rtol=RTOL[dtype], what=f"few-key attention {dtype}")


def test_reads_strided_views_as_the_model_makes_them():
    """q, k, v split from one packed projection (unbind views: row strides 3x wider, as the mouse path's
    t_qkv output), and previous keys of another layout, without copies."""
    gen = torch.Generator().manual_seed(3)
    packed = torch.randn(6, 3, 3, 2, 16, generator=gen).to(DEVICE)  # [B*S, F, (q, k, v), H, D]
    q, kc, vc = packed.unbind(2)
    prev = torch.randn(6, 2, 2, 2, 16, generator=gen).to(DEVICE)  # [B*S, P, (k, v), H, D]
    kp, vp = prev.unbind(2)
    valid = torch.tensor([1], dtype=torch.int32, device=DEVICE)
    out = few_key_attention(q, kp, vp, kc, vc, valid, 2, 1)
    ref = reference_few_key_attention(q, kp, vp, kc, vc, valid, 2, 1)
    assert not q.is_contiguous() and not kp.is_contiguous()
    assert_close(out, ref, atol=1e-5, what="few-key attention of strided views")


def test_limits_are_clear_errors():
    x = torch.randn(1, 4, 1, 16, device=DEVICE)
    valid = torch.tensor([1], dtype=torch.int32, device=DEVICE)
    many = torch.randn(1, 70, 1, 16, device=DEVICE)
    with pytest.raises(WanTrtError, match="73 keys, at most 64; use window_attention"):
        few_key_attention(x, x[:, :3], x[:, :3], many, many, valid, 3, 1)
    odd = torch.randn(1, 4, 1, 24, device=DEVICE)
    with pytest.raises(WanTrtError, match="head_dim 24 must be a power of two"):
        few_key_attention(odd, odd, odd, odd, odd, valid, 1, 4)
    with pytest.raises(WanTrtError, match="valid_frames must be an int32"):
        few_key_attention(x, x, x, x, x, valid.long(), 1, 4)
