"""The I/O contract of one static-cache denoising pass: the one source of every tensor name.

Export, engine build, buffer allocation, runtimes and validation all read a
:class:`PassSpec`; no tensor name is typed anywhere else. Shapes are static.

Inputs (B = 1, F = frames per block, S = tokens per frame, P = previous frames,
L = layers, La = action layers, dtype = the graph's compute precision):

    latents          [B, 16, F, H, W]          noisy latents x_t of the block
    timestep         [B, F]           fp32     warped timestep per frame (not truncated)
    cond_concat      [B, 20, F, H, W]          4 mask channels + image latent of the block
    visual_context   [B, 257, 1280]            CLIP image tokens (constant per stream)
    mouse_window     [B, F, 12, 2]             raw mouse frames each latent frame sees
    keyboard_window  [B, F, 12, K]             raw keyboard frames each latent frame sees
    self_k_prev_NN, self_v_prev_NN   [B, P*S, 12, 128]   post-RoPE K/V of the previous P frames,
                                                          one pair per layer NN (00 .. L-1)
    mouse_k_prev_NN, mouse_v_prev_NN [B*S, P, 16, 64]    one pair per action layer NN
    keyboard_k_prev_NN, ..._v_prev_NN [B, P, 16, 64]
    frame_rope_cos/_sin  [F, 22]      fp32     cos/sin of (absolute frame * frequency), main RoPE
    action_rope_cos/_sin [F, 4]       fp32     the same for the action attentions' temporal RoPE
    valid_frames     [1]              int32    how many of the P previous frames hold data (at the end)

The rotary inputs carry the block's absolute position (formed on the host in float64, see
:mod:`wan_trt.rotary`; :attr:`PassSpec.rotaries` says how), so no table limits a stream's length
(the one bound is 2**28 latent frames, :data:`wan_trt.rotary.MAX_STREAM_FRAMES`).

Outputs:

    flow             [B, 16, F, H, W]          flow prediction (x0 = x_t - sigma * flow)
    self_k_cur_NN, self_v_cur_NN     [B, F*S, 12, 128]   the block's post-RoPE K/V of layer NN,
                                                          to commit after the clean pass
    mouse_k_cur_NN, ..., keyboard_v_cur_NN                likewise

One tensor per layer, not one stacked tensor per cache: each layer's K/V leave the graph in
the buffers that computed them (stacking them copied every layer's K/V in every pass, about
0.8 ms of a 22 ms pass on an H100, though only the clean pass's are committed).

Commit after the clean pass, per (prev, cur) pair: prev <- last P frames of [prev ; cur]
along the frame axis; valid <- min(P, valid + F). When P == F that is a buffer swap.
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
from dataclasses import dataclass
from typing import Any

import torch

from wan_trt.config import WanConfig
from wan_trt.config_load import config_from_dict
from wan_trt.errors import WanTrtError
from wan_trt.precisions import PRECISIONS as PRECISION_DTYPES
from wan_trt.rotary import block_frequencies, rotary_factors
from wan_trt.scheduler import BlockSchedule

PRECISIONS = {name: getattr(torch, dtype) for name, dtype in PRECISION_DTYPES.items()}
DTYPE_NAMES = {torch.bfloat16: "bfloat16", torch.float16: "float16", torch.float32: "float32",
               torch.int32: "int32", torch.int64: "int64"}
DTYPES = {v: k for k, v in DTYPE_NAMES.items()}
SPEC_VERSION = 3  # 2: rotary factors as inputs instead of rope_offset; 3: one cache tensor per layer

# The graph's tensor names, typed here only: other modules use these or a PassSpec's name lists.
LATENTS, TIMESTEP, COND_CONCAT, VISUAL_CONTEXT = "latents", "timestep", "cond_concat", "visual_context"
MOUSE_WINDOW, KEYBOARD_WINDOW = "mouse_window", "keyboard_window"
ACTION_WINDOWS = {"mouse": MOUSE_WINDOW, "keyboard": KEYBOARD_WINDOW}  # action -> its window input
VALID_FRAMES = "valid_frames"
ROTARY_INPUTS = {"frame": ("frame_rope_cos", "frame_rope_sin"),  # rotary (wan_trt.rotary) -> its inputs
                 "action": ("action_rope_cos", "action_rope_sin")}
FLOW = "flow"


def precision_dtype(precision: str) -> torch.dtype:
    """A precision name (:mod:`wan_trt.precisions`) -> the torch dtype of its graph I/O."""
    if precision not in PRECISIONS:
        raise WanTrtError(f"--precision {precision!r}: expected one of {', '.join(PRECISIONS)}")
    return PRECISIONS[precision]


@dataclass(frozen=True)
class TensorSpec:
    """One graph input or output."""

    name: str
    shape: tuple[int, ...]
    dtype: str  # a key of DTYPES
    doc: str = ""

    @property
    def torch_dtype(self) -> torch.dtype:
        return DTYPES[self.dtype]

    @property
    def nbytes(self) -> int:
        n = 1
        for d in self.shape:
            n *= d
        return n * torch.empty((), dtype=self.torch_dtype).element_size()


@dataclass(frozen=True)
class RotarySpec:
    """A position-dependent rotary input pair: fp32 cos/sin [F, len(inv_freq)] of (frame * inv_freq)."""

    kind: str  # "frame" | "action"
    cos: str
    sin: str
    inv_freq: tuple[float, ...]

    def factors(self, start_frame: int, frames: int, device: str | torch.device = "cpu"
                ) -> tuple[torch.Tensor, torch.Tensor]:
        """cos, sin of the block of ``frames`` frames starting at absolute latent frame ``start_frame``."""
        return rotary_factors(self.inv_freq, start_frame, frames, device)


@dataclass(frozen=True)
class CacheSpec:
    """One rolling cache in static form: per layer a prev K/V input pair and a cur K/V output
    pair, and how to commit them.

    Tensors are [batch', frames * units, heads, head_dim] (``axis`` = 1 holds frames*units).
    """

    kind: str  # "self" | "mouse" | "keyboard"
    layers: tuple[int, ...]
    units: int  # tokens per frame along ``axis``
    prev_frames: int
    block_frames: int
    axis: int = 1

    def prev_names(self, layer: int) -> tuple[str, str]:
        """The K and V inputs of ``layer``: its keys and values of the previous frames."""
        return f"{self.kind}_k_prev_{layer:02d}", f"{self.kind}_v_prev_{layer:02d}"

    def cur_names(self, layer: int) -> tuple[str, str]:
        """The K and V outputs of ``layer``: its keys and values of this block."""
        return f"{self.kind}_k_cur_{layer:02d}", f"{self.kind}_v_cur_{layer:02d}"

    @property
    def pairs(self) -> tuple[tuple[str, str], ...]:
        """(prev input, cur output) name pairs: K then V of every layer, in layer order."""
        return tuple(pair for layer in self.layers for pair in zip(self.prev_names(layer), self.cur_names(layer)))


@dataclass(frozen=True)
class GraphSpec:
    """What every graph's spec holds: its config, precision and named, static-shaped I/O.

    :class:`PassSpec` (one DiT pass) and :class:`wan_trt.decoder_spec.DecoderSpec` (one decoder
    call) extend it; runners, exports, engines and checks read only these fields and methods.
    """

    config: WanConfig
    precision: str
    inputs: tuple[TensorSpec, ...]
    outputs: tuple[TensorSpec, ...]

    KIND = "pass"  # the graph kind (wan_trt.graphs), recorded in every spec dict but the pass's

    # ---- lookups ------------------------------------------------------------------------
    @property
    def dtype(self) -> torch.dtype:
        return precision_dtype(self.precision)

    @property
    def input_names(self) -> list[str]:
        return [t.name for t in self.inputs]

    @property
    def output_names(self) -> list[str]:
        return [t.name for t in self.outputs]

    def tensor(self, name: str) -> TensorSpec:
        for t in self.inputs + self.outputs:
            if t.name == name:
                return t
        raise KeyError(name)

    # ---- buffers ------------------------------------------------------------------------
    def allocate(self, which: str = "inputs", device: str | torch.device = "cpu") -> dict[str, torch.Tensor]:
        """Zero buffers for every input (or output), as the spec says."""
        specs = self.inputs if which == "inputs" else self.outputs
        return {t.name: torch.zeros(t.shape, dtype=t.torch_dtype, device=device) for t in specs}

    def check_feeds(self, feeds: dict[str, torch.Tensor]) -> None:
        """Raise WanTrtError naming every missing, unexpected, non-tensor or mis-shaped/typed input."""
        problems = [f"missing input '{n}'" for n in self.input_names if n not in feeds]
        problems += [f"unexpected input '{n}'" for n in feeds if n not in self.input_names]
        problems += [f"input '{n}' is a {type(v).__name__}, not a torch.Tensor" for n, v in feeds.items()
                     if not isinstance(v, torch.Tensor)]
        for t in self.inputs:
            got = feeds.get(t.name)
            if isinstance(got, torch.Tensor) and (tuple(got.shape) != t.shape or got.dtype != t.torch_dtype):
                problems.append(f"input '{t.name}': expected {list(t.shape)} {t.dtype}, "
                                f"got {list(got.shape)} {DTYPE_NAMES.get(got.dtype, got.dtype)}")
        if problems:
            raise WanTrtError("feeds do not match the graph spec: " + "; ".join(problems))

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "GraphSpec":
        """Rebuild from a manifest and check it equals the spec its config defines."""
        if data.get("spec_version") != SPEC_VERSION:
            raise WanTrtError(f"manifest spec_version {data.get('spec_version')} is not {SPEC_VERSION}: "
                              "re-export with this wan-trt")
        cfg = config_from_dict(data["config"], data["config"].get("name", "manifest"), "manifest")
        spec = cls.from_config(cfg, data["precision"], **cls.variant(data))
        if json.dumps(spec.to_dict(), sort_keys=True) != json.dumps(data, sort_keys=True):
            raise WanTrtError("manifest I/O does not match its own config: it was written by another "
                              "wan-trt version or edited; re-export")
        return spec

    @classmethod
    def from_config(cls, cfg: WanConfig, precision: str = "bf16", **variant: Any) -> "GraphSpec":
        raise NotImplementedError

    @classmethod
    def variant(cls, data: dict[str, Any]) -> dict[str, Any]:
        """The ``from_config`` keywords beyond config and precision that ``data`` (a spec dict) records."""
        return {}

    def to_dict(self) -> dict[str, Any]:
        raise NotImplementedError

    def fingerprint(self) -> str:
        """Short hash of the whole I/O contract (config + precision + tensors)."""
        return hashlib.sha256(json.dumps(self.to_dict(), sort_keys=True).encode()).hexdigest()[:16]


@dataclass(frozen=True)
class PassSpec(GraphSpec):
    """Everything a runtime needs to feed one pass: built from a config and a precision."""

    caches: tuple[CacheSpec, ...]
    rotaries: tuple[RotarySpec, ...]

    @classmethod
    def from_config(cls, cfg: WanConfig, precision: str = "bf16") -> "PassSpec":
        dt = DTYPE_NAMES[precision_dtype(precision)]
        m, a = cfg.model, cfg.model.action_config
        b, f, s, p = 1, cfg.block_frames, cfg.tokens_per_frame, cfg.prev_frames
        h, w = cfg.inference.latent_height, cfg.inference.latent_width
        inputs = [
            TensorSpec(LATENTS, (b, m.out_dim, f, h, w), dt, "noisy latents x_t of the block"),
            TensorSpec(TIMESTEP, (b, f), "float32", "warped timestep per latent frame"),
            TensorSpec(COND_CONCAT, (b, cfg.cond_channels, f, h, w), dt, "mask + image latent of the block"),
            TensorSpec(VISUAL_CONTEXT, (b, m.clip_tokens, m.clip_dim), dt, "CLIP image tokens"),
        ]
        if cfg.has_mouse:
            inputs.append(TensorSpec(MOUSE_WINDOW, (b, f, a.window_frames, a.mouse_dim_in), dt,
                                     "raw mouse frames seen by each latent frame"))
        if cfg.has_keyboard:
            inputs.append(TensorSpec(KEYBOARD_WINDOW, (b, f, a.window_frames, a.keyboard_dim_in), dt,
                                     "raw keyboard frames seen by each latent frame"))
        caches = [CacheSpec("self", tuple(range(m.num_layers)), s, p, f)]
        heads = {"self": (m.num_heads, cfg.head_dim)}
        batch = {"self": b}
        if cfg.has_mouse:
            caches.append(CacheSpec("mouse", cfg.action_layers, 1, p, f))
            heads["mouse"], batch["mouse"] = (a.heads_num, a.head_dim), b * s
        if cfg.has_keyboard:
            caches.append(CacheSpec("keyboard", cfg.action_layers, 1, p, f))
            heads["keyboard"], batch["keyboard"] = (a.heads_num, a.head_dim), b
        outputs = [TensorSpec(FLOW, (b, m.out_dim, f, h, w), dt, "flow prediction")]
        for c in caches:
            nh, hd = heads[c.kind]
            for layer in c.layers:
                if p > 0:
                    shape = (batch[c.kind], p * c.units, nh, hd)
                    inputs += [TensorSpec(name, shape, dt, f"{c.kind} {part} of layer {layer}, previous {p} frames")
                               for name, part in zip(c.prev_names(layer), ("keys", "values"))]
                shape = (batch[c.kind], f * c.units, nh, hd)
                outputs += [TensorSpec(name, shape, dt, f"{c.kind} {part} of layer {layer}, this block")
                            for name, part in zip(c.cur_names(layer), ("keys", "values"))]
        rotaries = tuple(RotarySpec(kind, *ROTARY_INPUTS[kind], freqs) for kind, freqs in block_frequencies(cfg).items())
        for r in rotaries:
            inputs += [TensorSpec(name, (f, len(r.inv_freq)), "float32", f"{part} of the block's {r.kind} rotary angles")
                       for name, part in ((r.cos, "cos"), (r.sin, "sin"))]
        if p > 0:
            inputs.append(TensorSpec(VALID_FRAMES, (1,), "int32", "valid previous frames (0..P)"))
        return cls(cfg, precision, tuple(inputs), tuple(outputs), tuple(caches), rotaries)

    def sample_inputs(self, seed: int = 0, device: str | torch.device = "cpu", start_frame: int | None = None
                      ) -> dict[str, torch.Tensor]:
        """Random but plausible inputs of one steady-state pass (all previous frames valid)."""
        gen = torch.Generator().manual_seed(seed)
        cfg = self.config
        feeds: dict[str, torch.Tensor] = {}
        for t in self.inputs:
            if t.torch_dtype == torch.int32 or any(t.name in (r.cos, r.sin) for r in self.rotaries):
                continue
            scale = 0.1 if t.name == MOUSE_WINDOW else 1.0
            feeds[t.name] = (torch.randn(t.shape, generator=gen) * scale).to(t.torch_dtype)
        if KEYBOARD_WINDOW in feeds:
            feeds[KEYBOARD_WINDOW] = (torch.rand(self.tensor(KEYBOARD_WINDOW).shape, generator=gen) > 0.7
                                        ).to(self.dtype)
        sched = BlockSchedule.from_config(cfg)
        steps = torch.tensor([*sched.timesteps, sched.clean_timestep])  # one pass of the config's schedule
        pick = steps[torch.randint(0, len(steps), (1,), generator=gen)]
        feeds[TIMESTEP] = pick.expand(self.tensor(TIMESTEP).shape).contiguous()
        first = cfg.prev_frames if start_frame is None else start_frame
        feeds.update(self.rotary_feeds(first))
        if cfg.prev_frames > 0:
            feeds[VALID_FRAMES] = torch.tensor([min(cfg.prev_frames, first)], dtype=torch.int32)
        return {k: v.to(device) for k, v in feeds.items()}

    def rotary_feeds(self, start_frame: int, device: str | torch.device = "cpu") -> dict[str, torch.Tensor]:
        """The rotary inputs of the block starting at absolute latent frame ``start_frame``."""
        feeds = {}
        for r in self.rotaries:
            feeds[r.cos], feeds[r.sin] = r.factors(start_frame, self.config.block_frames, device)
        return feeds

    def cache(self, kind: str) -> CacheSpec:
        for c in self.caches:
            if c.kind == kind:
                return c
        raise KeyError(kind)

    # ---- manifest -----------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        return {
            "spec_version": SPEC_VERSION,
            "precision": self.precision,
            "config": self.config.to_dict(),
            "inputs": [dataclasses.asdict(t) for t in self.inputs],
            "outputs": [dataclasses.asdict(t) for t in self.outputs],
            "caches": [dataclasses.asdict(c) for c in self.caches],
            "rotaries": [dataclasses.asdict(r) for r in self.rotaries],
        }
