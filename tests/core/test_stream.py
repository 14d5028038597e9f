import pytest
import torch

from wan_trt.config_load import load_config
from wan_trt.errors import WanTrtError
from wan_trt.pipeline import upstream_windows
from wan_trt.stream import ActionHistory, NoiseSource, raw_frames_in_block, raw_frames_until, synthetic_stream


def test_raw_frames_per_block():
    cfg = load_config("universal")
    assert [raw_frames_in_block(cfg, b) for b in range(3)] == [9, 12, 12]
    assert raw_frames_until(cfg, 1) == 9 and raw_frames_until(cfg, 5) == 57


@pytest.mark.parametrize("name", ["universal-small", "gta_drive-small"])
def test_bounded_history_windows_equal_upstream_slicing(name):
    """Two implementations of the windows: the session's bounded history and upstream's slicing."""
    cfg = load_config(name)
    blocks = 10
    history = torch.randn(1, raw_frames_until(cfg, blocks), 3)
    hist = ActionHistory()
    for block in range(blocks):
        end = raw_frames_until(cfg, block + 1)
        hist.append(history[:, end - raw_frames_in_block(cfg, block):end])
        start = block * cfg.block_frames
        torch.testing.assert_close(hist.windows(start, cfg.block_frames), upstream_windows(cfg, history, start),
                                   rtol=0, atol=0)
        hist.trim(start + cfg.block_frames)
    assert hist.frames.shape[1] <= 12 + 12  # bounded


def test_window_of_latent_frame_j():
    cfg = load_config("universal-small")
    history = torch.arange(40, dtype=torch.float32).reshape(1, 40, 1)
    w = upstream_windows(cfg, history, 3)  # block at latent frame 3
    # latent j sees padded [4j, 4j + 12) = raw [4j - 12, 4j), frame 0 repeated before the start
    assert w[0, 0, :, 0].tolist() == list(range(0, 12))
    assert w[0, 2, :, 0].tolist() == list(range(8, 20))
    w0 = upstream_windows(cfg, history, 0)
    assert w0[0, 0, :, 0].tolist() == [0.0] * 12 and w0[0, 2, :, 0].tolist() == [0.0] * 4 + list(range(8))


def test_history_too_short_is_an_error():
    hist = ActionHistory()
    hist.append(torch.zeros(1, 9, 2))
    with pytest.raises(Exception, match="raw action frames"):
        hist.windows(3, 3)


def test_noise_is_seeded_and_order_free():
    n = NoiseSource(7)
    a = n(2, 1, (4, 5))
    _ = n(0, 0, (4, 5))
    torch.testing.assert_close(n(2, 1, (4, 5)), a)
    assert not torch.equal(n(2, 2, (4, 5)), a)


def test_synthetic_stream_shapes():
    cfg = load_config("templerun-small")
    s = synthetic_stream(cfg, 4, seed=0)
    assert s.mouse is None and s.keyboard.shape == (1, raw_frames_until(cfg, 4), 7)
    assert s.cond_concat.shape == (1, 20, 12, 4, 6)
    assert s.cond_concat[:, :4, 0].eq(1).all() and s.cond_concat[:, :4, 1:].eq(0).all()


@pytest.mark.parametrize("first_block", [1, 5])
def test_history_started_at_a_later_block_equals_upstream_slicing_of_the_padded_history(first_block):
    """A stream from block N: the session's history (base = first raw frame seen) and the reference's
    (earlier raw frames replaced by that frame) cut the same windows; appended() leaves the original."""
    from wan_trt.pipeline import history_from
    from wan_trt.stream import first_raw_frame
    cfg = load_config("universal-small")
    history = torch.randn(1, raw_frames_until(cfg, first_block + 4), 2)
    seen = history_from(cfg, history, first_block)
    assert first_raw_frame(cfg, first_block) == 12 * first_block - 3
    assert torch.equal(seen[:, first_raw_frame(cfg, first_block):], history[:, first_raw_frame(cfg, first_block):])
    hist = ActionHistory(base=first_raw_frame(cfg, first_block))
    for block in range(first_block, first_block + 4):
        end = raw_frames_until(cfg, block + 1)
        before = hist.frames
        new = hist.appended(history[:, end - raw_frames_in_block(cfg, block):end])
        assert hist.frames is before
        hist = new
        start = block * cfg.block_frames
        torch.testing.assert_close(hist.windows(start, cfg.block_frames), upstream_windows(cfg, seen, start),
                                   rtol=0, atol=0)
        offset = first_raw_frame(cfg, first_block)  # the tail alone, as inputs from block N hold it
        assert torch.equal(upstream_windows(cfg, history[:, offset:], start, offset), upstream_windows(cfg, seen, start))
        hist.trim(start + cfg.block_frames)


def test_inputs_from_a_later_block_hold_only_that_blocks_frames_on():
    """Memory of inputs far into a stream does not grow with the position."""
    cfg = load_config("universal-small")
    s = synthetic_stream(cfg, 2, seed=0, first_block=10 ** 6)
    assert s.mouse.shape[1] == raw_frames_until(cfg, 10 ** 6 + 2) - (12 * 10 ** 6 - 3) == 24
    assert s.block_actions(cfg, 10 ** 6)[0].shape == (1, 12, 2) and s.block_cond(cfg, 10 ** 6 + 1).shape[2] == 3
    with pytest.raises(WanTrtError, match="hold blocks 1000000 .. 1000001, not block 2"):
        s.block_cond(cfg, 2)


def test_noise_of_different_seeds_never_is_another_seeds_noise_shifted_by_a_block():
    """A draw's seed was seed * 1000003 + block * 1009 + step, of which the CPU generator keeps the low 32 bits:
    seed 4140933051 drew exactly seed 0's noise one block later, and seed 2^32 was seed 0."""
    from wan_trt.stream import NoiseSource
    shape = (64,)
    shifted = 1009 * pow(1000003, -1, 2 ** 32) % 2 ** 32
    for block in range(3):
        assert not torch.equal(NoiseSource(shifted)(block, 0, shape), NoiseSource(0)(block + 1, 0, shape))
    assert not torch.equal(NoiseSource(2 ** 32)(0, 0, shape), NoiseSource(0)(0, 0, shape))
    assert torch.equal(NoiseSource(7)(3, 1, shape), NoiseSource(7)(3, 1, shape))  # still a function of its key
    draws = {NoiseSource(seed)(block, step, (4,))[0].item() for seed in range(4) for block in range(4)
             for step in range(4)}
    assert len(draws) == 64
