import pytest
import torch

from wan_trt.errors import WanTrtError
from wan_trt.plugins.window_attention import (GPU_TILINGS, INTERPRET, Tiling, autotune_configs,
                                              reference_window_attention, tiling_config, window_attention)
from tests.conftest import assert_close, attention_segments

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
DTYPES = [torch.float32, torch.float16] + ([] if INTERPRET else [torch.bfloat16])
TOL = {torch.float32: 1e-5, torch.float16: 2e-3, torch.bfloat16: 1e-2}


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("lq, prev_frames, units, heads, head_dim, valid", [
    (18, 3, 6, 2, 32, 3),    # small universal shape, steady state
    (18, 3, 6, 2, 32, 0),    # first block: no valid previous frame
    (50, 1, 17, 3, 64, 1),   # gta-like P = 1, odd lengths
    (33, 3, 11, 1, 16, 2),   # partially valid window, tiny head
    (40, 2, 9, 2, 128, 1),   # head_dim 128 (the real one)
    (64, 3, 40, 2, 32, 2),   # whole key blocks from an unaligned first valid key, then a tail
    (96, 2, 32, 1, 32, 1),   # segments of whole blocks only: no masked tail
    (18, 3, 6, 1, 32, 5),    # valid count beyond the window: every previous key, no out-of-range load
    (5, 2, 6, 1, 32, 2),     # current segment shorter than one key block
])
def test_matches_reference(dtype, lq, prev_frames, units, heads, head_dim, valid):
    q, kp, vp, kc, vc, valid_t = attention_segments(torch.Generator().manual_seed(lq + valid), 1, lq, lq,
                                                    prev_frames * units, heads, head_dim, valid, dtype, DEVICE)
    out = window_attention(q, kp, vp, kc, vc, valid_t, prev_frames, units)
    ref = reference_window_attention(q.float(), kp.float(), vp.float(), kc.float(), vc.float(), valid_t,
                                     prev_frames, units)
    assert_close(out, ref, atol=TOL[dtype], what=f"window attention {dtype}")


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("config", autotune_configs(), ids=str)
def test_every_tiling_matches_reference(dtype, config):
    """Each autotuned tiling (on a GPU also a TensorRT tactic that an engine may pick), not only the
    autotuner's winner: whole blocks, a previous segment starting mid-block and tail blocks."""
    q, kp, vp, kc, vc, valid = attention_segments(torch.Generator().manual_seed(7), 1, 300, 300, 3 * 100, 2, 64, 2,
                                                  dtype, DEVICE)
    out = window_attention(q, kp, vp, kc, vc, valid, 3, 100, config=config)
    ref = reference_window_attention(q.float(), kp.float(), vp.float(), kc.float(), vc.float(), valid, 3, 100)
    assert_close(out, ref, atol=TOL[dtype], what=f"window attention {config}")


def test_tilings_are_checked():
    assert all(tiling_config(t) for t in GPU_TILINGS)
    for bad in (Tiling(256, 64, 16, 3, 8), Tiling(256, 64, 16, 3, 128), Tiling(96, 64, 8, 3, 32)):
        with pytest.raises(WanTrtError, match="powers of two"):
            tiling_config(bad)


def test_invalid_previous_frames_do_not_leak():
    """With valid = 0 the previous keys must not matter at all."""
    q, kc, vc = (torch.randn(1, 12, 1, 16, device=DEVICE) for _ in range(3))
    valid = torch.tensor([0], dtype=torch.int32, device=DEVICE)
    a = window_attention(q, torch.randn(1, 12, 1, 16, device=DEVICE), torch.randn(1, 12, 1, 16, device=DEVICE),
                         kc, vc, valid, 3, 4)
    b = window_attention(q, torch.zeros(1, 12, 1, 16, device=DEVICE), torch.zeros(1, 12, 1, 16, device=DEVICE),
                         kc, vc, valid, 3, 4)
    assert_close(a, b, atol=1e-6, what="prev ignored")


def test_limits_are_clear_errors():
    q = torch.randn(1, 8, 1, 24, device=DEVICE)
    valid = torch.tensor([1], dtype=torch.int32, device=DEVICE)
    with pytest.raises(WanTrtError, match="head_dim 24"):
        window_attention(q, q, q, q, q, valid, 1, 8)
    q = torch.randn(1, 8, 1, 32, device=DEVICE)
    with pytest.raises(WanTrtError, match="k_prev"):
        window_attention(q, q.half(), q, q, q, valid, 1, 8)
    with pytest.raises(WanTrtError, match="valid_frames"):
        window_attention(q, q, q, q, q, valid.long(), 1, 8)
    kv = torch.randn(1, 8, 2, 1, 32, device=DEVICE)  # k and v interleaved: strides unlike q's
    with pytest.raises(WanTrtError, match="v_cur strides"):
        window_attention(q, q, q, q, kv[:, :, 1], valid, 1, 8)


def test_layouts_that_differ_only_where_unused_are_accepted():
    """Strides of size-1 dims and of empty segments are never used: a k from a longer cache is fine."""
    q = torch.randn(1, 8, 1, 32, device=DEVICE)
    valid = torch.tensor([1], dtype=torch.int32, device=DEVICE)
    cache = torch.randn(1, 16, 1, 32, device=DEVICE)
    k_prev, v_prev = cache[:, :8], torch.randn(1, 8, 1, 32, device=DEVICE)  # batch strides 512 vs 256
    out = window_attention(q, k_prev, v_prev, q, q, valid, 1, 8)
    ref = reference_window_attention(q, k_prev, v_prev, q, q, valid, 1, 8)
    assert_close(out, ref, atol=1e-5, what="k from a longer cache")
    empty = torch.randn(1, 0, 1, 32, device=DEVICE)
    window_attention(q, empty, cache[:, :0], q, q, valid, 0, 8)
