"""The decoder's fused norm (bias [+ residual], norm, SiLU, join with the history) against its
reference, on odd shapes: channels not a power of two, extra (padded) input channels, several
batches, frames of odd sizes (a program's rows lie in one frame: 1 row a program where the frame's size is
odd, many where it is a multiple of a power of two)."""
import pytest
import torch

from wan_trt.errors import WanTrtError
from wan_trt.plugins.decoder_norm import (add_norm_silu_join, norm_silu_join, reference_add_norm_silu_join,
                                          reference_norm_silu_join, reference_split_add_norm_silu_join,
                                          reference_split_norm_silu_join, split_add_norm_silu_join,
                                          split_norm_silu_join)
from tests.conftest import assert_close

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
DTYPES = [torch.float32, torch.float16, torch.bfloat16]  # no tl.dot: the interpreter computes bf16 right
TOL = {torch.float32: 1e-5, torch.float16: 4e-3, torch.bfloat16: 3e-2}


CL = torch.channels_last_3d


def _inputs(dtype, batch, frames, h, w, c, cx, seed):
    """x [B, Cx, T, H, W], bias, r [B, C, T, H, W], gamma, history [B, C, 2, H, W]; activations channels-last."""
    gen = torch.Generator().manual_seed(seed)
    def r(*shape, scale=1.0, shift=0.0):
        t = (shift + scale * torch.randn(*shape, generator=gen)).to(DEVICE, dtype)
        return t.contiguous(memory_format=CL) if t.ndim == 5 else t
    return (r(batch, cx, frames, h, w, scale=3), r(cx), r(batch, c, frames, h, w), r(c, scale=0.2, shift=1),
            r(batch, c, 2, h, w))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("batch, frames, h, w, c, cx", [
    (1, 3, 2, 3, 24, 32), (2, 1, 3, 5, 6, 6), (1, 2, 1, 7, 96, 128), (1, 1, 2, 2, 40, 40), (2, 3, 4, 8, 6, 8)])
def test_norm_silu_join_matches_reference(dtype, batch, frames, h, w, c, cx):
    x, bias, r, gamma, history = _inputs(dtype, batch, frames, h, w, c, cx, c + frames)
    joined = norm_silu_join(x, bias, gamma, history)
    assert joined.shape == (batch, c, 2 + frames, h, w) and joined.is_contiguous(memory_format=CL)
    assert torch.equal(joined[:, :, :2], history)  # the history is copied, not recomputed
    assert_close(joined, reference_norm_silu_join(x, bias, gamma, history), atol=TOL[dtype], rtol=TOL[dtype],
                 what=f"norm_silu_join {dtype}")
    s, joined = add_norm_silu_join(x, bias, r, gamma, history)
    s_ref, joined_ref = reference_add_norm_silu_join(x, bias, r, gamma, history)
    assert s.is_contiguous(memory_format=CL) and joined.is_contiguous(memory_format=CL)
    assert_close(s, s_ref, atol=TOL[dtype], rtol=TOL[dtype], what=f"residual sum {dtype}")
    assert_close(joined, joined_ref, atol=TOL[dtype], rtol=TOL[dtype], what=f"add_norm_silu_join {dtype}")


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("batch, frames, h, w, c, cx, cx2", [
    (1, 3, 2, 3, 24, 16, 8), (2, 1, 3, 5, 6, 4, 4), (1, 2, 1, 7, 192, 128, 64), (1, 1, 2, 2, 40, 32, 16),
    (2, 3, 4, 8, 6, 4, 4)])
def test_split_norm_silu_join_matches_reference(dtype, batch, frames, h, w, c, cx, cx2):
    """x in two parts along channels (a convolution computed as two, the tail possibly padded): the same
    as the unsplit ops of the joined x, and as the references."""
    x, bias, r, gamma, history = _inputs(dtype, batch, frames, h, w, c, cx + cx2, c * frames)
    head, tail = (t.contiguous(memory_format=CL) for t in (x[:, :cx], x[:, cx:]))
    joined = split_norm_silu_join(head, tail, bias, gamma, history)
    assert joined.shape == (batch, c, 2 + frames, h, w) and joined.is_contiguous(memory_format=CL)
    unsplit = {torch.float32: 1e-6, torch.float16: 1e-3, torch.bfloat16: 8e-3}[dtype]  # a GPU may contract
    # the two loads' sums otherwise (one rounding apart): the unsplit op's numbers, but for that
    torch.testing.assert_close(joined, norm_silu_join(x, bias, gamma, history), rtol=unsplit, atol=unsplit)
    assert_close(joined, reference_split_norm_silu_join(head, tail, bias, gamma, history), atol=TOL[dtype],
                 rtol=TOL[dtype], what=f"split_norm_silu_join {dtype}")
    s, joined = split_add_norm_silu_join(head, tail, bias, r, gamma, history)
    s_ref, joined_ref = reference_split_add_norm_silu_join(head, tail, bias, r, gamma, history)
    s_whole, joined_whole = add_norm_silu_join(x, bias, r, gamma, history)
    torch.testing.assert_close(s, s_whole, rtol=unsplit, atol=unsplit)
    torch.testing.assert_close(joined, joined_whole, rtol=unsplit, atol=unsplit)
    assert_close(s, s_ref, atol=TOL[dtype], rtol=TOL[dtype], what=f"split residual sum {dtype}")
    assert_close(joined, joined_ref, atol=TOL[dtype], rtol=TOL[dtype], what=f"split_add_norm_silu_join {dtype}")


def test_reference_is_the_decoders_norm_and_silu():
    """The reference equals the decoder's own modules: RMS_norm (F.normalize * sqrt(C) * gamma), SiLU."""
    from wan_trt.model.vae import RMS_norm
    x, bias, r, gamma, history = _inputs(torch.float32, 1, 3, 2, 3, 24, 32, 0)
    norm = RMS_norm(24, images=False)
    norm.gamma.data = gamma.view(-1, 1, 1, 1).cpu()
    y = (x[:, :24] + bias[:24].view(-1, 1, 1, 1) + r).cpu()
    want = torch.nn.functional.silu(norm(y))
    _, joined = reference_add_norm_silu_join(x, bias, r, gamma, history)
    torch.testing.assert_close(joined[:, :, 2:].cpu(), want, rtol=1e-5, atol=1e-5)


def test_bad_shapes_are_refused():
    x, bias, r, gamma, history = _inputs(torch.float32, 1, 3, 2, 3, 24, 32, 0)
    for args in ((x, bias[:24], gamma, history), (x, bias, gamma, history[:, :, :1].contiguous(memory_format=CL)),
                 (x[:, :16].contiguous(memory_format=CL), bias[:16], gamma, history)):
        with pytest.raises(WanTrtError, match="expected x"):
            norm_silu_join(*args)
    with pytest.raises(WanTrtError, match="norm_silu_join: x must be channels-last"):
        norm_silu_join(x.contiguous(), bias, gamma, history)
    with pytest.raises(WanTrtError, match="add_norm_silu_join: expected x .* r \\[B, C, T, H, W\\]"):
        add_norm_silu_join(x, bias, r[:, :, :2].contiguous(memory_format=CL), gamma, history)
    with pytest.raises(WanTrtError, match="one dtype"):
        add_norm_silu_join(x, bias, r.half(), gamma, history)
    with pytest.raises(WanTrtError, match="expected x"):
        norm_silu_join(x[0], bias, gamma, history)
    head, tail = (t.contiguous(memory_format=CL) for t in (x[:, :16], x[:, 16:]))
    with pytest.raises(WanTrtError, match="split_norm_silu_join: expected x .* x_tail"):
        split_norm_silu_join(head, tail, bias[:24], gamma, history)  # bias of the first part only
    with pytest.raises(WanTrtError, match="split_norm_silu_join: expected x .* gamma \\[Cx < C"):
        split_norm_silu_join(x, tail, torch.cat([bias, bias[:16]]), gamma, history)  # C within the first part
    with pytest.raises(WanTrtError, match="split_add_norm_silu_join: x_tail must be channels-last"):
        split_add_norm_silu_join(head, x[:, 16:].contiguous(), bias, r, gamma, history)


def test_a_programs_rows_never_straddle_two_frames():
    """A program either copies history rows or normalises activation rows: its rows must lie in one frame, so the
    launch's rows divide a frame's, whatever the frame's size (odd ones take fewer rows)."""
    from wan_trt.plugins.launch import rows_launch
    for channels in (2, 6, 96, 192, 384):
        for frame_rows in (1, 6, 15, 24, 3520, 14080, 225280):
            rows = rows_launch(channels, frame_rows).blocks["BLOCK_R"]
            assert frame_rows % rows == 0 and rows & (rows - 1) == 0, (channels, frame_rows, rows)
    assert rows_launch(96, 225280).blocks == {"BLOCK_R": 32, "BLOCK_C": 128}
