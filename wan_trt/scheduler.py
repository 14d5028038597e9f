"""Flow-matching schedule of the distilled model (upstream FlowMatchScheduler, shift 5, 1000 steps).

    sigma_i = shift * s_i / (1 + (shift - 1) * s_i),  s = linspace(1, 0, 1001)[:-1]   (fp32)
    t_i     = 1000 * sigma_i
    warped denoising steps: cat(t, [0])[1000 - step]   (1000, 908.84, 713.98 for 1000/666/333)
    x0      = x_t - sigma(t) * flow                     (float64, as upstream)
    x_next  = (1 - sigma(t')) * x0 + sigma(t') * noise  (fp32)

sigma(t) is looked up by the nearest table timestep, as upstream does.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from wan_trt.config import WanConfig


class FlowMatchScheduler:
    def __init__(self, shift: float, num_train_timesteps: int = 1000):
        s = torch.linspace(1.0, 0.0, num_train_timesteps + 1)[:-1]
        self.num_train_timesteps = num_train_timesteps
        self.sigmas = shift * s / (1 + (shift - 1) * s)
        self.timesteps = self.sigmas * num_train_timesteps

    def warp(self, steps: tuple[int, ...]) -> torch.Tensor:
        """Integer denoising steps -> the fp32 timesteps the model sees."""
        table = torch.cat([self.timesteps, torch.zeros(1)])
        return table[self.num_train_timesteps - torch.tensor(steps, dtype=torch.long)]

    def sigma(self, t: float) -> float:
        """sigma of the table timestep nearest to ``t`` (fp32 value as a Python float)."""
        index = torch.argmin((self.timesteps - torch.tensor(t, dtype=torch.float32)).abs())
        return float(self.sigmas[index])


@dataclass(frozen=True)
class BlockSchedule:
    """The per-block pass schedule: timesteps, their sigmas, and the clean pass."""

    timesteps: tuple[float, ...]  # denoising passes, fp32 values
    sigmas: tuple[float, ...]  # sigma of each denoising timestep
    clean_timestep: float = 0.0

    @classmethod
    def from_config(cls, cfg: WanConfig) -> "BlockSchedule":
        inf = cfg.inference
        sched = FlowMatchScheduler(inf.timestep_shift, inf.num_train_timesteps)
        steps = (sched.warp(inf.denoising_step_list) if inf.warp_denoising_step
                 else torch.tensor(inf.denoising_step_list, dtype=torch.float32))
        ts = tuple(float(t) for t in steps)
        return cls(ts, tuple(sched.sigma(t) for t in ts), float(inf.context_noise))


def flow_to_x0(flow: torch.Tensor, xt: torch.Tensor, sigma: float) -> torch.Tensor:
    """x0 = x_t - sigma * flow in float64, returned in flow's dtype."""
    return (xt.double() - sigma * flow.double()).to(flow.dtype)


def renoise(x0: torch.Tensor, noise: torch.Tensor, sigma: float) -> torch.Tensor:
    """(1 - sigma) * x0 + sigma * noise in fp32, returned in noise's dtype."""
    return ((1 - sigma) * x0.float() + sigma * noise.float()).to(noise.dtype)
