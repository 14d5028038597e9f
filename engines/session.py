"""StreamingSession: the per-block schedule over any backend, with the caches kept on the device.

    session = StreamingSession(runner, seed=0)
    session.start(visual_context)
    for each block:
        result = session.step(cond_concat_block, mouse_frames, keyboard_frames)
        result.latents  # [1, 16, 3, 44, 80]

Every input buffer is allocated once from the spec. One block = the denoising passes
(x0 = x_t - sigma * flow, then re-noise) and the clean pass at t = 0, whose current-block
K/V is committed as the next block's previous-frames cache: a swap when P == F, a
slice copy otherwise; never a reallocation.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field

import torch

from wan_trt.engines.runner import Runner
from wan_trt.errors import WanTrtError
from wan_trt.log import logger
from wan_trt.scheduler import BlockSchedule, flow_to_x0, renoise
from wan_trt.spec import CacheSpec
from wan_trt.stream import ActionHistory, NoiseSource, raw_frames_in_block


@dataclass
class BlockResult:
    """One streamed block: its latents and where the time went (seconds, synchronised)."""

    index: int
    start_frame: int
    latents: torch.Tensor
    seconds: float
    pass_seconds: list[float] = field(default_factory=list)


class StreamingSession:
    """Streams blocks through ``runner`` (any backend) with the static-cache schedule."""

    def __init__(self, runner: Runner, seed: int = 0, noise: NoiseSource | None = None):
        self.runner = runner
        self.spec = runner.spec
        self.cfg = self.spec.config
        self.device = runner.device
        self.dtype = self.spec.dtype
        self.schedule = BlockSchedule.from_config(self.cfg)
        self.noise = noise or NoiseSource(seed)
        self.feeds = self.spec.allocate("inputs", self.device)
        a = self.cfg.model.action_config
        self.histories = {name: ActionHistory(a.window_frames, a.vae_time_compression_ratio)
                          for name in ("mouse", "keyboard") if f"{name}_window" in self.feeds}
        self.block = 0
        self.valid_frames = 0

    @property
    def start_frame(self) -> int:
        return self.block * self.cfg.block_frames

    def start(self, visual_context: torch.Tensor) -> None:
        """Begin a new stream conditioned on CLIP features [1, 257, 1280]; clears every cache.

        Activates the runner if it is not active yet (the caller still owns deactivating it).
        """
        self.runner.__enter__()
        self._check_shape("visual_context", visual_context, self.spec.tensor("visual_context").shape)
        self.feeds["visual_context"].copy_(visual_context)
        for name in self.feeds:
            if name.endswith("_prev"):
                self.feeds[name].zero_()
        a = self.cfg.model.action_config
        self.histories = {k: ActionHistory(a.window_frames, a.vae_time_compression_ratio) for k in self.histories}
        self.block = 0
        self.valid_frames = 0

    @torch.no_grad()
    def step(self, cond_concat: torch.Tensor, mouse: torch.Tensor | None = None,
             keyboard: torch.Tensor | None = None, sync: bool = True) -> BlockResult:
        """Generate the next block.

        Args:
            cond_concat: [1, 20, F, H, W] mask + image latent of this block.
            mouse, keyboard: this block's new raw action frames [1, n, D] (n = 9 for the first
                block, 12 after) or one action [1, D] held for the whole block. Required when the
                config has that input, refused otherwise.
            sync: synchronise the device so the timings are real. Defaults to True.
        """
        begin = time.perf_counter()
        start, frames = self.start_frame, self.cfg.block_frames
        limit = self.cfg.inference.rope_max_frames
        if start + frames > limit:
            raise WanTrtError(f"block {self.block} would end at latent frame {start + frames}, past the "
                              f"{limit}-frame RoPE table ({4 * limit - 3} video frames): start a new stream")
        self._check_shape("cond_concat", cond_concat, self.spec.tensor("cond_concat").shape)
        self._feed_actions(mouse, keyboard)
        self.feeds["cond_concat"].copy_(cond_concat)
        self.feeds["rope_offset"].fill_(start)
        if "valid_frames" in self.feeds:
            self.feeds["valid_frames"].fill_(self.valid_frames)
        x0, pass_seconds = self._denoise(sync)
        outputs = self._run(x0, self.schedule.clean_timestep, pass_seconds, sync)
        self._commit(outputs)
        if sync and self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        result = BlockResult(self.block, start, x0, time.perf_counter() - begin, pass_seconds)
        logger.debug("block %d: %.1f ms", self.block, 1e3 * result.seconds)
        self.block += 1
        for history in self.histories.values():
            history.trim(self.start_frame)
        return result

    # ---- stages -----------------------------------------------------------------------------
    def _denoise(self, sync: bool) -> tuple[torch.Tensor, list[float]]:
        latents = self.spec.tensor("latents")
        x = self.noise(self.block, 0, latents.shape, self.device, self.dtype)
        sched, seconds = self.schedule, []
        for i, (t, sigma) in enumerate(zip(sched.timesteps, sched.sigmas)):
            x0 = flow_to_x0(self._run(x, t, seconds, sync)["flow"], x, sigma)
            if i + 1 < len(sched.timesteps):
                x = renoise(x0, self.noise(self.block, i + 1, latents.shape, self.device, self.dtype),
                            sched.sigmas[i + 1])
        return x0, seconds

    def _run(self, x: torch.Tensor, t: float, seconds: list[float], sync: bool = False) -> dict[str, torch.Tensor]:
        begin = time.perf_counter()
        self.feeds["latents"].copy_(x)
        self.feeds["timestep"].fill_(t)
        outputs = self.runner.infer(self.feeds)
        if sync and self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        seconds.append(time.perf_counter() - begin)
        return outputs

    def _commit(self, outputs: dict[str, torch.Tensor]) -> None:
        """prev <- last P frames of [prev ; cur]; valid <- min(P, valid + F)."""
        p, f = self.cfg.prev_frames, self.cfg.block_frames
        if p == 0:
            return
        for cache in self.spec.caches:
            for prev, cur in cache.pairs:
                self._commit_one(cache, prev, cur, outputs[cur], p, f)
        self.valid_frames = min(p, self.valid_frames + f)

    def _commit_one(self, cache: CacheSpec, prev: str, cur: str, new: torch.Tensor, p: int, f: int) -> None:
        u, buf = cache.units, self.feeds[prev]
        if p == f and self.runner.swap_inputs:  # swap: the block's K/V becomes the previous frames
            self.feeds[prev] = new
            if self.runner.owns_outputs:
                self.runner.rebind_output(cur, buf)
        elif p <= f:
            buf.copy_(new[:, :, (f - p) * u:])
        else:
            buf[:, :, :(p - f) * u] = buf[:, :, f * u:].clone()
            buf[:, :, (p - f) * u:] = new

    def _feed_actions(self, mouse: torch.Tensor | None, keyboard: torch.Tensor | None) -> None:
        raw = raw_frames_in_block(self.cfg, self.block)
        for name, value in (("mouse", mouse), ("keyboard", keyboard)):
            if name not in self.histories:
                if value is not None:
                    raise WanTrtError(f"config '{self.cfg.name}' has no {name} input; pass {name}=None")
                continue
            if value is None:
                raise WanTrtError(f"config '{self.cfg.name}' needs {name} actions for every block")
            dim = self.spec.tensor(f"{name}_window").shape[-1]
            if value.ndim == 2:  # one action held over the block
                value = value[:, None, :].expand(-1, raw, -1)
            self._check_shape(name, value, (1, raw, dim))
            history = self.histories[name]
            history.append(value.to(self.device, self.dtype))
            self.feeds[f"{name}_window"].copy_(history.windows(self.start_frame, self.cfg.block_frames))

    def _check_shape(self, name: str, value: torch.Tensor, shape: tuple[int, ...]) -> None:
        if tuple(value.shape) != tuple(shape):
            raise WanTrtError(f"{name}: expected shape {list(shape)} for block {self.block} of "
                              f"'{self.cfg.name}', got {list(value.shape)}")


def stream_blocks(session: StreamingSession, inputs, blocks: int, sync: bool = True) -> list[BlockResult]:
    """Run ``blocks`` blocks of a :class:`~wan_trt.stream.StreamInputs` through a fresh stream."""
    from wan_trt.log import progress

    cfg = session.cfg
    session.start(inputs.visual_context.to(session.device, session.dtype))
    results = []
    for block in progress(range(blocks), "blocks", total=blocks):
        mouse, keyboard = inputs.block_actions(cfg, block)
        move = (lambda t: None if t is None else t.to(session.device, session.dtype))
        results.append(session.step(move(inputs.block_cond(cfg, block)), move(mouse), move(keyboard), sync=sync))
    return results
