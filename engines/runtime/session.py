"""StreamingSession: the per-block schedule over any backend, with the caches kept on the device.

    session = StreamingSession(runner, seed=0, decoder=decoder)   # decoder: optional DecoderStream
    session.start(visual_context)         # start_block=N: from block N, empty caches
    for each block:
        result = session.step(cond_concat_block, mouse_frames, keyboard_frames)
        result.latents  # [1, 16, 3, 44, 80]
        result.frames   # with a decoder: uint8 [n, 352, 640, 3] on the device (n = 9, then 12)
        result.stage_ms # {"passes", "clean", "checks", "decode", "commit"}: milliseconds

Every input buffer is allocated once from the spec. One block = the denoising passes
(x0 = x_t - sigma * flow, then re-noise) and the clean pass at t = 0, whose current-block
K/V is committed as the next block's previous-frames cache: a swap when P == F, a
slice copy otherwise; never a reallocation. A step checks its inputs' shapes and types before it
changes anything, and a block that comes out NaN/Inf is refused (:class:`NonFiniteBlock`) uncommitted.
Given its inputs on the device, a step waits for nothing before its passes are queued (inputs on the
host are copied to it first): the inputs' finiteness is read with the outputs' (one sync), and a step
whose inputs hold NaN/Inf is refused there, naming the input, with nothing committed (its passes ran:
only the per-block feeds and the runner's outputs were overwritten, which every step overwrites).
"""
from __future__ import annotations

import time
import weakref
from dataclasses import dataclass, field
from typing import Callable

import torch

from wan_trt.decoder_spec import RGB
from wan_trt.engines.runtime.cublas_workspace import prefer_workspace_free_gemms
from wan_trt.engines.runtime.cuda_graph import CapturedCall
from wan_trt.engines.runtime.decoder import DecoderStream
from wan_trt.engines.runtime.finite import (NonFiniteBlock, NonFiniteFrames, first_flagged, first_non_finite,
                                            largest_magnitudes)
from wan_trt.engines.runtime.runner import Runner, checked_tensor
from wan_trt.engines.runtime.staging import HostStaging
from wan_trt.errors import WanTrtError
from wan_trt.log import logger, progress
from wan_trt.rotary import MAX_STREAM_FRAMES
from wan_trt.scheduler import BlockSchedule, flow_to_x0, renoise
from wan_trt.spec import (ACTION_WINDOWS, COND_CONCAT, FLOW, LATENTS, TIMESTEP, VALID_FRAMES, VISUAL_CONTEXT,
                          PassSpec)
from wan_trt.stream import ActionHistory, NoiseSource, first_raw_frame, max_stream_blocks, raw_frames_in_block


@dataclass
class BlockResult:
    """One streamed block: its latents, its frames (with a decoder) and its time (seconds, up to the
    step's final device sync); ``stage_ms``: milliseconds of the denoising passes, the clean pass, the
    output checks (with the next block's first noise and rotary tables, queued just before them), the
    decode and the cache commit (device time between events on a GPU, no extra sync); ``pass_seconds``
    only when the step was asked to time its passes."""

    index: int
    start_frame: int
    latents: torch.Tensor
    seconds: float
    pass_seconds: list[float] = field(default_factory=list)
    frames: torch.Tensor | None = None
    stage_ms: dict[str, float] = field(default_factory=dict)


class StageClock:
    """Marks stage boundaries without synchronising: CUDA events on a GPU, the host clock on a CPU;
    :meth:`elapsed_ms` (after the caller's sync) gives each stage's milliseconds."""

    def __init__(self, device: torch.device):
        self.cuda = device.type == "cuda"
        self.stream = torch.cuda.current_stream(device) if self.cuda else None
        self.marks: list[tuple[str, object]] = []
        self.mark("start")

    def mark(self, stage: str) -> None:
        """End of ``stage`` (the first mark is the start)."""
        if self.cuda:
            event = torch.cuda.Event(enable_timing=True)
            event.record(self.stream)
            self.marks.append((stage, event))
        else:
            self.marks.append((stage, time.perf_counter()))

    def elapsed_ms(self) -> dict[str, float]:
        out = {}
        for (_, a), (stage, b) in zip(self.marks, self.marks[1:]):
            out[stage] = a.elapsed_time(b) if self.cuda else 1e3 * (b - a)
        return out


def _require_kind(name: str, value: object, kind: type, make: str, optional: bool = False) -> None:
    """Refuse an argument ``name`` that is not a ``kind`` (None allowed where ``optional``), saying how to make one: a
    path given as the seed or the runner failed later with an AttributeError."""
    if not isinstance(value, kind) and not (optional and value is None):
        raise WanTrtError(f"{name}: expected a {kind.__name__} ({make}), got {type(value).__name__} {value!r}")


@dataclass(frozen=True)
class BlockInputs:
    """One block's inputs, checked and on the session's device and dtype; nothing committed yet.

    cond_concat: [1, 20, F, H, W]; windows: ``<name>_window`` -> [1, F, 12, D];
    histories: the action histories with this block's raw frames appended; checked: the inputs whose
    finiteness the step checks with its outputs (converted), given: the same as the caller passed them.
    """

    cond_concat: torch.Tensor
    windows: dict[str, torch.Tensor]
    histories: dict[str, ActionHistory]
    checked: dict[str, torch.Tensor]
    given: dict[str, torch.Tensor]


class StreamingSession:
    """Streams blocks through ``runner`` (any backend) with the static-cache schedule.

    ``step`` is atomic: it checks every input's shape and type (and that :meth:`start` was called)
    before it changes any state, and a block whose inputs hold NaN/Inf, or whose latents or caches
    come out non-finite, is refused without committing anything (caches, valid frames, action
    histories, decoder histories), so the stream stays as it was before that step.

    ``graph_block_end`` (default True): with a runner whose buffers keep their addresses (CUDA
    graphs, ``fixed_buffers``), the check of a block's new cache entries and their commit each run
    as one captured CUDA graph (:class:`~wan_trt.engines.runtime.cuda_graph.CapturedCall`); False
    runs them op by op, as for every other runner.
    """

    def __init__(self, runner: Runner, seed: int | None = None, noise: NoiseSource | None = None,
                 decoder: DecoderStream | None = None):
        prefer_workspace_free_gemms()  # effective where no GEMM ran in this process yet (see its module)
        _require_kind("runner", runner, Runner, "a runner from wan_trt.engines.backends.make_runner")
        if not isinstance(runner.spec, PassSpec):  # a decoder call's runner, say
            raise WanTrtError(f"runner: {runner.name} runs the {runner.spec.KIND} graph, not the DiT's pass: give the "
                              "session a runner of a DiT export (`wan-trt export`), and a decoder engine pair as "
                              "decoder=DecoderStream.from_engine(ENGINE, BACKEND, DEVICE)")
        _require_kind("noise", noise, NoiseSource, "NoiseSource(seed), or leave it out", optional=True)
        _require_kind("decoder", decoder, DecoderStream, "DecoderStream.from_engine(ENGINE), or leave it out",
                      optional=True)
        self.runner = runner
        self.spec = runner.spec
        self.cfg = self.spec.config
        self.device = runner.device
        self.dtype = self.spec.dtype
        self.schedule = BlockSchedule.from_config(self.cfg)
        if noise is not None and seed is not None:  # the seed would be dropped
            raise WanTrtError(f"seed {seed} and a NoiseSource (seed {noise.seed}) given: the noise source draws the "
                              "noise; give one of the two")
        self.noise = noise or NoiseSource(0 if seed is None else seed)
        self.feeds = self.spec.allocate("inputs", self.device)
        rotary = [name for r in self.spec.rotaries for name in (r.cos, r.sin)]
        self.rotary = HostStaging(self.feeds, rotary, self.device) if rotary else None
        self._rotary_start: int | None = None  # the start frame whose tables the rotary feeds hold
        self._next_noise: tuple[int, torch.Tensor] | None = None  # (block, its first noise), drawn ahead
        self.histories = self._new_histories(0)
        self.started = False
        self.block = 0
        self.stream_start = 0
        self.valid_frames = 0
        self.decoder: DecoderStream | None = None
        if decoder is not None:
            self.attach_decoder(decoder)
        self.graph_block_end = True
        self._captured = {"checks": CapturedCall(), "commit": CapturedCall()}
        self._pairs = [pair for cache in self.spec.caches for pair in cache.pairs] if self.cfg.prev_frames else []

    def attach_decoder(self, decoder: DecoderStream) -> None:
        """Decode every later block to frames. Refused mid-stream: the decoder's histories start with the
        stream (its first block decodes by the first-frame rule), so attach it before the first step."""
        decoder.check_attachable(self.spec)
        owner = decoder.owner() if decoder.owner is not None else None
        if owner is not None and owner is not self and owner.decoder is decoder:
            raise WanTrtError("this decoder is attached to another session: a decoder carries one stream's histories "
                              "(a second session's start would reset them under the first); give each session its "
                              "own, or call detach_decoder() on the other session first")
        if self.started and self.block != self.stream_start:
            raise WanTrtError(f"a decoder attached at block {self.block} would lack the histories of the "
                              f"{self.block - self.stream_start} block(s) already streamed: attach it before the "
                              "first step, or start a new stream")
        if decoder.device != self.device:
            raise WanTrtError(f"the decoder runs on {decoder.device}, the session on {self.device}")
        if self.started:  # start() activated the runner; the decoder needs the same
            decoder.__enter__()
        self.decoder = decoder
        decoder.owner = weakref.ref(self)
        decoder.reset()

    def detach_decoder(self) -> None:
        """Stop decoding; the decoder may then be attached to another session. It stays active (loaded): as
        with the runner, the caller exits it (``decoder.__exit__``) when done with it."""
        if self.decoder is not None:
            self.decoder.owner = None
            self.decoder = None

    @property
    def start_frame(self) -> int:
        return self.block * self.cfg.block_frames

    @torch.no_grad()
    def start(self, visual_context: torch.Tensor, *, start_block: int = 0) -> None:
        """Begin a new stream conditioned on CLIP features [1, 257, 1280]; clears every cache.

        Args:
            visual_context: [1, 257, 1280] CLIP features, checked once per stream; their values are copied (an
                autograd graph they are part of is not kept).
            start_block: absolute index of the first block (its RoPE position and noise draws);
                the stream starts with empty caches and its action history padded with the
                first raw frame it is given. Defaults to 0.

        Activates the runner if it is not active yet (the caller still owns deactivating it).
        """
        self._check_start_block(start_block)
        given = visual_context
        visual_context = self._checked(VISUAL_CONTEXT, visual_context, self.spec.tensor(VISUAL_CONTEXT).shape,
                                       f"the stream starting at block {start_block}")
        self._check_finite({VISUAL_CONTEXT: visual_context}, "of the stream", {VISUAL_CONTEXT: given})
        self.runner.__enter__()
        if self.decoder is not None:
            self.decoder.__enter__()
            self.decoder.reset()
        self.feeds[VISUAL_CONTEXT].copy_(visual_context)
        for prev, _ in self._cache_pairs():
            self.feeds[prev].zero_()
        self.histories = self._new_histories(start_block)
        self.block = self.stream_start = start_block
        self.valid_frames = 0
        self._next_noise = None
        self.started = True

    @torch.no_grad()
    def step(self, cond_concat: torch.Tensor, mouse: torch.Tensor | None = None,
             keyboard: torch.Tensor | None = None, time_passes: bool = False) -> BlockResult:
        """Generate the next block.

        Args:
            cond_concat: [1, 20, F, H, W] mask + image latent of this block.
            mouse, keyboard: this block's new raw action frames [1, n, D] (n = 9 for block 0,
                12 after) or one action [1, D] held for the whole block. Required when the
                config has that input, refused otherwise.
            time_passes: synchronise the device after every pass to time each one (profiling: it
                idles the device between passes). Without it nothing synchronises between the
                passes (the host prepares each while the device runs the previous one); the step's
                checks and its end synchronise, so ``seconds`` is the block's real time either way.
                Defaults to False.

        Raises:
            WanTrtError: an input of the wrong shape or type (nothing changed), or NaN/Inf in an input
                or the block (nothing committed).
        """
        begin = time.perf_counter()
        block = self._validate_block_inputs(cond_concat, mouse, keyboard)
        clock = StageClock(self.device)
        self._feed(block)
        x0, pass_seconds = self._denoise(time_passes)
        clock.mark("passes")
        outputs = self._run(x0, self.schedule.clean_timestep, pass_seconds, time_passes)
        clock.mark("clean")
        commit = self._prepare_commit(outputs)  # while the device runs the clean pass
        self._stage_next_block()  # so too
        self._check_outputs(x0, outputs, block)
        clock.mark("checks")
        frames = None
        if self.decoder is not None:  # before the commit: a decode that fails leaves the caches as they were
            try:
                frames = self.decoder.decode(x0)
            except NonFiniteFrames as exc:
                raise NonFiniteBlock(f"{RGB} of block {self.block} came out non-finite (NaN or Inf): the block was "
                                     f"not committed and the session is as before it; {exc}",
                                     block=self.block, tensor=RGB) from exc
            clock.mark("decode")
        commit()
        self.histories = block.histories
        clock.mark("commit")
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        result = BlockResult(self.block, self.start_frame, x0, time.perf_counter() - begin, pass_seconds, frames,
                             clock.elapsed_ms())
        logger.debug("block %d: %.1f ms", self.block, 1e3 * result.seconds)
        self.block += 1
        for history in self.histories.values():
            history.trim(self.start_frame)
        return result

    # ---- checks (no state changes) ------------------------------------------------------------
    def _validate_block_inputs(self, cond_concat: torch.Tensor, mouse: torch.Tensor | None,
                               keyboard: torch.Tensor | None) -> BlockInputs:
        """Every check of a step that needs no device sync, before anything changes: started, RoPE range,
        shapes, dtypes (finiteness: with the outputs, :meth:`_check_outputs`)."""
        if not self.started:
            raise WanTrtError("step() before start(): call session.start(visual_context) first")
        start, frames = self.start_frame, self.cfg.block_frames
        if not self._within_reach(self.block):
            raise WanTrtError(f"block {self.block} would end at latent frame {start + frames}, past the "
                              f"{MAX_STREAM_FRAMES} latent frames a stream can reach: start a new stream")
        cond = self._checked(COND_CONCAT, cond_concat, self.spec.tensor(COND_CONCAT).shape)
        raw = self._raw_actions(mouse, keyboard)
        given = {COND_CONCAT: cond_concat, "mouse": mouse, "keyboard": keyboard}
        histories = {name: self.histories[name].appended(value) for name, value in raw.items()}
        windows = {ACTION_WINDOWS[name]: h.windows(start, frames) for name, h in histories.items()}
        return BlockInputs(cond, windows, histories, {COND_CONCAT: cond, **raw}, given)

    def _raw_actions(self, mouse: torch.Tensor | None, keyboard: torch.Tensor | None) -> dict[str, torch.Tensor]:
        """This block's raw action frames [1, n, D] per input the config has (held actions expanded)."""
        n = raw_frames_in_block(self.cfg, self.block)
        raw = {}
        for name, value in (("mouse", mouse), ("keyboard", keyboard)):
            if name not in self.histories:
                if value is not None:
                    raise WanTrtError(f"config '{self.cfg.name}' has no {name} input; pass {name}=None")
                continue
            if value is None:
                raise WanTrtError(f"config '{self.cfg.name}' needs {name} actions for every block")
            dim = self.spec.tensor(ACTION_WINDOWS[name]).shape[-1]
            if isinstance(value, torch.Tensor) and value.ndim == 2:  # one action held over the block: [1, D]
                if tuple(value.shape) != (1, dim):
                    raise WanTrtError(f"{name}: expected [1, {dim}] (one action held for block {self.block}) or "
                                      f"[1, {n}, {dim}] (one per video frame), got {list(value.shape)}")
                # its kind checked before it is expanded (a sparse one cannot be)
                checked_tensor(name, value, (1, dim), f"block {self.block} of '{self.cfg.name}'", numbers=True)
                value = value[:, None, :].expand(-1, n, -1)
            raw[name] = self._checked(name, value, (1, n, dim))
        return raw

    def _checked(self, name: str, value: torch.Tensor, shape: tuple[int, ...], what: str | None = None
                 ) -> torch.Tensor:
        """``value`` as a tensor of ``shape`` (:func:`checked_tensor`: actions may be 0/1 integers or booleans, the
        image features must be floating) on the session's device and dtype; ``what`` it is for in messages
        (default: the block about to run)."""
        what = f"{what or f'block {self.block}'} of '{self.cfg.name}'"
        return checked_tensor(name, value, shape, what, numbers=name in ACTION_WINDOWS).to(self.device, self.dtype)

    def _check_start_block(self, start_block: int) -> None:
        if isinstance(start_block, bool) or not isinstance(start_block, int) or start_block < 0:
            raise WanTrtError(f"start_block: expected an int >= 0, got {start_block!r}")
        most = max_stream_blocks(self.cfg)
        if start_block >= most:
            raise WanTrtError(f"start_block {start_block}: a stream reaches {MAX_STREAM_FRAMES} latent frames "
                              f"({most} blocks of {self.cfg.block_frames}); start at block {most - 1} or earlier")

    def _check_finite(self, tensors: dict[str, torch.Tensor], where: str,
                      given: dict[str, torch.Tensor] | None = None) -> None:
        """Refuse non-finite inputs: the first non-finite tensor is named with ``where``. ``given``: the tensors
        as the caller passed them, before their conversion to the session's dtype: a finite value beyond that
        dtype's range is named as such, not as NaN or Inf."""
        name = first_non_finite(tensors)
        if name is None:
            return
        original = (given or {}).get(name)
        if isinstance(original, torch.Tensor) and original.dtype != self.dtype and \
                first_non_finite({name: original}) is None:
            top = original.abs().max().item()
            most = torch.finfo(self.dtype).max
            raise WanTrtError(f"{name} {where} holds values beyond {self.dtype}'s range (largest magnitude "
                              f"{top:.6g}, {self.dtype} holds up to {most:.6g}); scale them down")
        raise WanTrtError(f"{name} {where} holds non-finite values (NaN or Inf); pass finite inputs")

    def _graphed(self) -> bool:
        return self.graph_block_end and self.runner.fixed_buffers

    def _check_outputs(self, x0: torch.Tensor, outputs: dict[str, torch.Tensor], block: BlockInputs) -> None:
        """Refuse a block whose inputs hold NaN/Inf (named as in :meth:`_check_finite`) or whose latents or
        new cache entries came out non-finite, before anything is committed: one device sync."""
        entries = {cur: outputs[cur] for _, cur in self._cache_pairs()}
        if self._graphed() and entries:  # the entries' reduction replayed, the inputs' and the latents' beside it
            tensors = list(entries.values())
            largest = self._captured["checks"](tensors, lambda: largest_magnitudes(tensors))
            beside = largest_magnitudes([*block.checked.values(), x0])
            name = first_flagged([*block.checked, LATENTS, *entries], torch.cat([beside, largest]))
        else:
            name = first_non_finite({**block.checked, LATENTS: x0, **entries})
        if name in block.checked:
            self._check_finite(block.checked, f"of block {self.block}", block.given)
        if name is not None:
            raise NonFiniteBlock(f"{name} of block {self.block} came out non-finite (NaN or Inf): the block was not "
                                 f"committed and the session is as before it; check the weights and the inputs "
                                 f"(or the precision: fp16 overflows where bf16 does not), or start a new stream",
                                 block=self.block, tensor=name)

    # ---- stages -----------------------------------------------------------------------------
    def _new_histories(self, start_block: int) -> dict[str, ActionHistory]:
        a, base = self.cfg.model.action_config, first_raw_frame(self.cfg, start_block)
        return {name: ActionHistory(a.window_frames, a.vae_time_compression_ratio, base)
                for name, window in ACTION_WINDOWS.items() if window in self.feeds}

    def _feed(self, block: BlockInputs) -> None:
        """Per-block feeds (overwritten by every step; the caches are not touched)."""
        self.feeds[COND_CONCAT].copy_(block.cond_concat)
        for name, window in block.windows.items():
            self.feeds[name].copy_(window)
        self._load_rotaries(self.start_frame)
        if VALID_FRAMES in self.feeds:
            self.feeds[VALID_FRAMES].fill_(self.valid_frames)

    def _rotary_feeds(self, start_frame: int) -> dict[str, torch.Tensor]:
        """The rotary factors of the block starting at ``start_frame`` (its absolute position), formed on
        the host in float64."""
        return self.spec.rotary_feeds(start_frame)

    def _load_rotaries(self, start_frame: int) -> None:
        """The rotary feeds for the block starting at ``start_frame``, unless they hold its tables already."""
        if self.rotary is not None and self._rotary_start != start_frame:
            self._rotary_start = None  # until the load is queued
            self.rotary.load(self._rotary_feeds(start_frame))
            self._rotary_start = start_frame

    def _stage_next_block(self) -> None:
        """The next block's rotary tables and first noise, made while the device runs this block's clean
        pass: the host would otherwise make them at the next step's start with the device idle. Both are
        queued after the clean pass, the last reader of this block's tables; a refused block leaves the
        next step to load its own tables again (the feeds say which start frame they hold)."""
        following = self.block + 1
        if not self._within_reach(following):
            return
        self._load_rotaries(following * self.cfg.block_frames)
        self._next_noise = (following, self._first_noise(following))

    def _within_reach(self, block: int) -> bool:
        """Whether ``block`` ends within the latent frames a stream can reach (:data:`MAX_STREAM_FRAMES`)."""
        return block < max_stream_blocks(self.cfg)

    def _first_noise(self, block: int) -> torch.Tensor:
        return self.noise(block, 0, self.spec.tensor(LATENTS).shape, self.device, self.dtype)

    def _denoise(self, time_passes: bool) -> tuple[torch.Tensor, list[float]]:
        latents = self.spec.tensor(LATENTS)
        ahead, self._next_noise = self._next_noise, None
        x = ahead[1] if ahead is not None and ahead[0] == self.block else self._first_noise(self.block)
        sched, seconds = self.schedule, []
        for i, (t, sigma) in enumerate(zip(sched.timesteps, sched.sigmas)):
            x0 = flow_to_x0(self._run(x, t, seconds, time_passes)[FLOW], x, sigma)
            if i + 1 < len(sched.timesteps):
                x = renoise(x0, self.noise(self.block, i + 1, latents.shape, self.device, self.dtype),
                            sched.sigmas[i + 1])
        return x0, seconds

    def _run(self, x: torch.Tensor, t: float, seconds: list[float], timed: bool = False) -> dict[str, torch.Tensor]:
        """One pass; ``timed``: synchronised, its wall time appended to ``seconds``."""
        begin = time.perf_counter()
        self.feeds[LATENTS].copy_(x)
        self.feeds[TIMESTEP].fill_(t)
        outputs = self.runner.infer(self.feeds)
        if timed:
            if self.device.type == "cuda":
                torch.cuda.synchronize(self.device)
            seconds.append(time.perf_counter() - begin)
        return outputs

    def _cache_pairs(self) -> list[tuple[str, str]]:
        """(prev input, cur output) of every cache layer's K and V; none when there are no previous frames."""
        return self._pairs

    def _prepare_commit(self, outputs: dict[str, torch.Tensor]) -> Callable[[], None]:
        """The block's commit, to run once its outputs pass the check. With fixed buffers its graph is
        captured here (or its buffers' addresses compared), so after the check's sync the commit is one
        graph launch; a runner with fixed buffers never swaps, so its copies are the same every block."""
        if not (self._graphed() and self._pairs):
            return lambda: self._commit(outputs)
        buffers = [t for prev, cur in self._pairs for t in (self.feeds[prev], outputs[cur])]
        captured = self._captured["commit"].prepare(buffers, lambda: self._copy_caches(outputs))

        def commit() -> None:
            captured.replay()
            self._advance_valid_frames()
        return commit

    def _commit(self, outputs: dict[str, torch.Tensor]) -> None:
        """prev <- last P frames of [prev ; cur]; valid <- min(P, valid + F)."""
        if self.cfg.prev_frames:
            self._copy_caches(outputs)
            self._advance_valid_frames()

    def _advance_valid_frames(self) -> None:
        self.valid_frames = min(self.cfg.prev_frames, self.valid_frames + self.cfg.block_frames)

    def _copy_caches(self, outputs: dict[str, torch.Tensor]) -> None:
        """The commit's swaps and copies. The copies of every layer's K and V go in one multi-tensor
        copy (a launch per tensor left the GPU waiting)."""
        p, f = self.cfg.prev_frames, self.cfg.block_frames
        targets, sources = [], []
        for cache in self.spec.caches:
            u = cache.units
            for prev, cur in cache.pairs:
                new, buf = outputs[cur], self.feeds[prev]  # [batch', frames * units, heads, head_dim]
                if p == f and self.runner.swap_inputs and new.is_contiguous():  # swap: the block's K/V becomes
                    # the previous frames (a strided view would be read as dense by an engine: copied instead)
                    self.feeds[prev] = new
                    if self.runner.owns_outputs:
                        self.runner.rebind_output(cur, buf)
                elif p <= f:
                    targets.append(buf)
                    sources.append(new if p == f else new[:, (f - p) * u:])
                else:
                    buf[:, :(p - f) * u] = buf[:, f * u:].clone()
                    targets.append(buf[:, (p - f) * u:])
                    sources.append(new)
        if targets:
            torch._foreach_copy_(targets, sources)


def stream_blocks(session: StreamingSession, inputs, blocks: int, time_passes: bool = False, *,
                  start_block: int = 0, keep_frames_on: str | None = None) -> list[BlockResult]:
    """Run ``blocks`` blocks of a :class:`~wan_trt.stream.StreamInputs` through a fresh stream
    that starts at block ``start_block`` (``inputs`` hold that block and the ones after it);
    ``keep_frames_on``: move each block's frames there (e.g. 'cpu') as soon as it is made."""
    cfg = session.cfg
    session.start(inputs.visual_context.to(session.device), start_block=start_block)
    results = []
    for block in progress(range(start_block, start_block + blocks), "blocks", total=blocks):
        mouse, keyboard = inputs.block_actions(cfg, block)
        move = (lambda t: None if t is None else t.to(session.device))  # the session checks, then converts
        result = session.step(move(inputs.block_cond(cfg, block)), move(mouse), move(keyboard),
                              time_passes=time_passes)
        if keep_frames_on is not None and result.frames is not None:
            result.frames = result.frames.to(keep_frames_on)
        results.append(result)
    return results
