"""The one frozen config that travels from the CLI through export, build, validate and run.

A :class:`WanConfig` holds the upstream model fields (``ModelConfig``, upstream
``config.json`` names kept so users can pass their own file), the streaming
settings (``InferenceConfig``, upstream ``inference_*.yaml`` names) and the
quantities derived from both. Every cross-field check happens here, once, before
any expensive work. Presets and files are read by :mod:`wan_trt.config_load`.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from wan_trt.config_json import field_error
from wan_trt.sizes import check_sizes


@dataclass(frozen=True)
class ActionConfig:
    """The action module (upstream ``action_config``); empty ``blocks`` means no module."""

    blocks: tuple[int, ...] = ()
    enable_keyboard: bool = True
    enable_mouse: bool = True
    heads_num: int = 16
    hidden_size: int = 128
    img_hidden_size: int = 1536
    keyboard_dim_in: int = 6
    keyboard_hidden_dim: int = 1024
    mouse_dim_in: int = 2
    mouse_hidden_dim: int = 1024
    mouse_qk_dim_list: tuple[int, ...] = (8, 28, 28)
    rope_dim_list: tuple[int, ...] = (8, 28, 28)
    rope_theta: float = 256.0
    windows_size: int = 3
    vae_time_compression_ratio: int = 4
    patch_size: tuple[int, ...] = (1, 2, 2)
    qk_norm: bool = True
    qkv_bias: bool = False

    @property
    def head_dim(self) -> int:
        """Head size of the keyboard and mouse attentions (they share the rotary factors)."""
        return self.keyboard_hidden_dim // self.heads_num

    @property
    def window_frames(self) -> int:
        """Raw action frames seen by one latent frame (4 x 3 = 12)."""
        return self.vae_time_compression_ratio * self.windows_size


@dataclass(frozen=True)
class ModelConfig:
    """CausalWanModel constructor arguments, upstream names."""

    dim: int = 1536
    ffn_dim: int = 8960
    freq_dim: int = 256
    in_dim: int = 36
    out_dim: int = 16
    num_heads: int = 12
    num_layers: int = 30
    eps: float = 1e-6
    local_attn_size: int = 6
    sink_size: int = 0
    model_type: str = "i2v"
    text_len: int = 512
    patch_size: tuple[int, ...] = (1, 2, 2)
    qk_norm: bool = True
    cross_attn_norm: bool = True
    action_config: ActionConfig = field(default_factory=ActionConfig)
    # wan-trt extensions (fixed by the CLIP encoder upstream; small test configs shrink them)
    clip_dim: int = 1280
    clip_tokens: int = 257


@dataclass(frozen=True)
class InferenceConfig:
    """Streaming settings (upstream inference yaml names)."""

    num_frame_per_block: int = 3
    denoising_step_list: tuple[int, ...] = (1000, 666, 333)
    warp_denoising_step: bool = True
    timestep_shift: float = 5.0
    context_noise: float = 0.0
    latent_height: int = 44
    latent_width: int = 80
    num_train_timesteps: int = 1000
    vae_dim: int = 96  # base width of the video decoder (Wan2.1's VAE: 96; small presets: 8)


@dataclass(frozen=True)
class WanConfig:
    """Model + streaming settings + derived geometry. Build it with :func:`wan_trt.config_load.load_config`."""

    name: str
    model: ModelConfig
    inference: InferenceConfig

    # ---- derived geometry -------------------------------------------------------------
    @property
    def head_dim(self) -> int:
        return self.model.dim // self.model.num_heads

    @property
    def grid_hw(self) -> tuple[int, int]:
        """Patch grid of one latent frame (22, 40 for 44x80 latents)."""
        _, ph, pw = self.model.patch_size
        return self.inference.latent_height // ph, self.inference.latent_width // pw

    @property
    def tokens_per_frame(self) -> int:
        h, w = self.grid_hw
        return h * w

    @property
    def block_frames(self) -> int:
        return self.inference.num_frame_per_block

    @property
    def tokens_per_block(self) -> int:
        return self.tokens_per_frame * self.block_frames

    @property
    def prev_frames(self) -> int:
        """Capacity P of the previous-frames cache: local_attn_size - frames per block."""
        return self.model.local_attn_size - self.block_frames

    @property
    def action_layers(self) -> tuple[int, ...]:
        return tuple(sorted(self.model.action_config.blocks))

    @property
    def has_mouse(self) -> bool:
        return bool(self.action_layers) and self.model.action_config.enable_mouse

    @property
    def has_keyboard(self) -> bool:
        return bool(self.action_layers) and self.model.action_config.enable_keyboard

    @property
    def passes_per_block(self) -> int:
        """Denoising passes plus the clean pass that rewrites the caches."""
        return len(self.inference.denoising_step_list) + 1

    @property
    def cond_channels(self) -> int:
        """Channels of cond_concat: 4 mask channels + the image latent."""
        return self.model.in_dim - self.model.out_dim

    def to_dict(self) -> dict[str, Any]:
        """A JSON-able dict that :func:`wan_trt.config_load.config_from_dict` reads back."""
        return {"name": self.name, "model": _plain(self.model), "inference": _plain(self.inference)}

    def replace(self, **inference_changes: Any) -> "WanConfig":
        """A copy with some streaming settings changed, checked again."""
        cfg = dataclasses.replace(
            self, inference=dataclasses.replace(self.inference, **inference_changes))
        validate(cfg)
        return cfg


def _plain(obj: Any) -> Any:
    if dataclasses.is_dataclass(obj):
        return {f.name: _plain(getattr(obj, f.name)) for f in dataclasses.fields(obj)}
    if isinstance(obj, tuple):
        return [_plain(v) for v in obj]
    return obj


# ---- validation --------------------------------------------------------------------------

def _check(ok: bool, fieldname: str, expected: str, got: Any, where: str) -> None:
    if not ok:
        raise field_error(fieldname, expected, got, where)


def _positive_ints(obj: Any, names: list[str], prefix: str, where: str) -> None:
    for name in names:
        value = getattr(obj, name)
        _check(isinstance(value, int) and not isinstance(value, bool) and value > 0,
               prefix + name, "a positive integer", value, where)


def validate(cfg: WanConfig, where: str = "config") -> None:
    """All cross-field checks, in one place. Raises WanTrtError naming the field."""
    m, inf, a = cfg.model, cfg.inference, cfg.model.action_config
    _positive_ints(m, ["dim", "ffn_dim", "freq_dim", "in_dim", "out_dim", "num_heads",
                       "num_layers", "local_attn_size", "clip_dim", "clip_tokens"], "model.", where)
    _positive_ints(inf, ["num_frame_per_block", "latent_height", "latent_width",
                         "num_train_timesteps", "vae_dim"], "inference.", where)
    _check(m.model_type == "i2v", "model_type", "'i2v'", m.model_type, where)
    _check(m.sink_size == 0, "sink_size", "0 (attention sinks are not supported)", m.sink_size, where)
    for name in ("qk_norm", "cross_attn_norm"):  # the model always has these norms (every released config does)
        _check(getattr(m, name) is True, name, "true (the model without these norms is not supported)",
               getattr(m, name), where)
    _check(isinstance(m.eps, (int, float)) and 0 < m.eps < 1, "eps", "a small positive number", m.eps, where)
    _check(m.dim % m.num_heads == 0, "num_heads", f"a divisor of dim={m.dim}", m.num_heads, where)
    d = m.dim // m.num_heads
    _check(d % 2 == 0 and d >= 6 and (d // 6) >= 1 and (d - 4 * (d // 6)) % 2 == 0, "num_heads",
           "a head size dim/num_heads that splits into even 3D RoPE parts", m.num_heads, where)
    _check(m.freq_dim % 2 == 0, "freq_dim", "an even number", m.freq_dim, where)
    _check(len(m.patch_size) == 3 and m.patch_size[0] == 1 and all(p > 0 for p in m.patch_size),
           "patch_size", "[1, ph, pw]", list(m.patch_size), where)
    _check(m.in_dim == 2 * m.out_dim + 4, "in_dim", f"2*out_dim+4 = {2 * m.out_dim + 4} "
           "(noisy latents + 4 mask channels + image latent)", m.in_dim, where)
    _check(m.local_attn_size >= inf.num_frame_per_block, "local_attn_size",
           f"at least num_frame_per_block={inf.num_frame_per_block} (-1, global attention, "
           "cannot stream)", m.local_attn_size, where)
    _check(inf.latent_height % m.patch_size[1] == 0 and inf.latent_width % m.patch_size[2] == 0,
           "inference.latent_height/latent_width", f"multiples of patch_size {list(m.patch_size)}",
           (inf.latent_height, inf.latent_width), where)
    steps = inf.denoising_step_list
    _check(len(steps) > 0 and all(isinstance(s, int) and 0 < s <= inf.num_train_timesteps for s in steps),
           "inference.denoising_step_list", f"integers in (0, {inf.num_train_timesteps}]", list(steps), where)
    _check(list(steps) == sorted(steps, reverse=True) and len(set(steps)) == len(steps),
           "inference.denoising_step_list", "strictly decreasing steps", list(steps), where)
    # the schedule is computed in fp32 (scheduler.py): a shift far from 1 makes its sigmas 0/0 or Inf/Inf
    _check(1e-3 <= inf.timestep_shift <= 1e3, "inference.timestep_shift",
           "a number in [0.001, 1000] (the presets': 5; far out the fp32 schedule breaks: at 1e-8 its sigmas are 0/0)",
           inf.timestep_shift, where)
    _check(inf.context_noise == 0, "inference.context_noise", "0 (the clean pass runs at t=0)",
           inf.context_noise, where)
    if a.blocks:
        _validate_action(cfg, where)
    check_sizes(cfg, where)


def _validate_action(cfg: WanConfig, where: str) -> None:
    m, a = cfg.model, cfg.model.action_config
    p = "action_config."
    _check(all(isinstance(b, int) and 0 <= b < m.num_layers for b in a.blocks), p + "blocks",
           f"layer indices in [0, {m.num_layers})", list(a.blocks), where)
    _check(len(set(a.blocks)) == len(a.blocks), p + "blocks", "distinct layer indices", list(a.blocks), where)
    _check(a.enable_keyboard or a.enable_mouse, p + "enable_keyboard/enable_mouse",
           "at least one enabled", (a.enable_keyboard, a.enable_mouse), where)
    _check(a.qk_norm is True, p + "qk_norm", "true (the action attentions without their q/k norms are not "
           "supported)", a.qk_norm, where)
    _positive_ints(a, ["heads_num", "hidden_size", "img_hidden_size", "keyboard_dim_in",
                       "keyboard_hidden_dim", "mouse_dim_in", "mouse_hidden_dim", "windows_size",
                       "vae_time_compression_ratio"], p, where)
    _check(a.img_hidden_size == m.dim, p + "img_hidden_size", f"dim={m.dim}", a.img_hidden_size, where)
    _check(a.keyboard_hidden_dim % a.heads_num == 0, p + "keyboard_hidden_dim",
           f"a multiple of heads_num={a.heads_num}", a.keyboard_hidden_dim, where)
    _check(a.mouse_hidden_dim == a.keyboard_hidden_dim, p + "mouse_hidden_dim",
           f"keyboard_hidden_dim={a.keyboard_hidden_dim} (both attentions share one set of rotary factors)",
           a.mouse_hidden_dim, where)
    _check(sum(a.mouse_qk_dim_list) == a.head_dim and all(x % 2 == 0 and x > 0 for x in a.mouse_qk_dim_list),
           p + "mouse_qk_dim_list", f"positive even parts summing to the action head size {a.head_dim}",
           list(a.mouse_qk_dim_list), where)
    _check(isinstance(a.rope_theta, (int, float)) and a.rope_theta > 1, p + "rope_theta",
           "a number above 1 (the rotary base)", a.rope_theta, where)
    _check(tuple(a.patch_size) == tuple(m.patch_size), p + "patch_size",
           f"the model patch_size {list(m.patch_size)}", list(a.patch_size), where)
    _check(a.vae_time_compression_ratio == 4 and a.windows_size == 3,
           p + "vae_time_compression_ratio/windows_size", "4 and 3 (the streaming schedule's raw "
           "frame windows)", (a.vae_time_compression_ratio, a.windows_size), where)
