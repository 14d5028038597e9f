import pytest
import torch

from wan_trt.config_load import load_config
from wan_trt.scheduler import BlockSchedule, flow_to_x0, renoise


def test_warped_timesteps_are_upstreams_floats():
    uni = BlockSchedule.from_config(load_config("universal"))
    assert uni.timesteps == pytest.approx((1000.0, 908.84, 713.98), abs=5e-3)
    assert uni.timesteps[1] != int(uni.timesteps[1])  # never truncated to an integer
    assert uni.sigmas == pytest.approx([t / 1000 for t in uni.timesteps], rel=1e-5)
    tr = BlockSchedule.from_config(load_config("templerun"))
    assert tr.timesteps == pytest.approx((1000.0, 937.5, 833.33, 625.0), abs=5e-3)


def test_shifted_sigma_formula():
    sched = BlockSchedule.from_config(load_config("universal"))
    s = 1 - 334 / 1000  # index 1000 - 666
    assert sched.sigmas[1] == pytest.approx(5 * s / (1 + 4 * s), rel=1e-6)


def test_x0_and_renoise():
    x, flow, noise = torch.randn(3, 4), torch.randn(3, 4), torch.randn(3, 4)
    x0 = flow_to_x0(flow, x, 0.25)
    torch.testing.assert_close(x0, x - 0.25 * flow)
    torch.testing.assert_close(renoise(x0, noise, 0.5), 0.5 * x0 + 0.5 * noise)
