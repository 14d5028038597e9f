import pytest
import torch

from wan_trt.model.caches import RollingKV, StaticCaches


@pytest.mark.parametrize("local, block", [(6, 3), (4, 3), (9, 3), (3, 3)])
def test_rolling_window_is_last_prev_frames_plus_current(local, block):
    """Upstream's roll/evict arithmetic keeps exactly [last (local - block) frames ; current block]."""
    units = 2
    cache = RollingKV(1, local, units, 1, 1, torch.float32, "cpu")
    history = []
    for b in range(7):
        start = b * block
        for rep in range(3):  # denoising passes of one block overwrite the same slot
            k = torch.arange(start * units, (start + block) * units, dtype=torch.float32).view(1, -1, 1, 1) + 0.1 * rep
            window, _ = cache.update(k, k.clone(), start)
        history.append(k)
        expected = torch.cat(history, dim=1)[:, -local * units:]  # the last `local` frames
        torch.testing.assert_close(window, expected)


def test_static_window_masks_invalid_previous_frames():
    prev = torch.arange(4 * 2, dtype=torch.float32).view(1, 8, 1, 1)  # P = 4 frames of 2 units
    caches = StaticCaches({"self": {0: (prev, prev)}}, torch.tensor([1], dtype=torch.int32), 4, {"self": 2})
    cur = torch.full((1, 6, 1, 1), -1.0)
    k_all, _, valid = caches.window("self", 0, cur, cur)
    assert k_all.shape[1] == 14
    assert valid.tolist() == [False] * 6 + [True] * 2 + [True] * 6  # 1 valid frame = the last 2 slots
    assert caches.current["self"][0][0] is cur
