"""How big the model of a config is, counted analytically, and the bounds it must stay within.

Checked by :func:`wan_trt.config.validate` before anything is allocated, so a typo such as
``"num_layers": 1000000000`` or ``"dim": 65536`` fails in microseconds with the fields named,
instead of exhausting memory. The count equals the parameters of
``wan_trt.model.CausalWanModel`` exactly (a test compares it with the model built on the meta
device for every preset).
"""
from __future__ import annotations

import math
import os
from typing import TYPE_CHECKING

from wan_trt.config_json import field_error
from wan_trt.errors import WanTrtError

if TYPE_CHECKING:
    from wan_trt.config import ActionConfig, WanConfig

MAX_PARAMETERS = 100_000_000_000  # 60x Matrix-Game 2.0 (1.6 B); 400 GB in fp32
MAX_LAYERS = 1024
MAX_TOKENS_PER_FRAME = 1 << 16  # upstream: 22 x 40 = 880
MAX_WINDOW_FRAMES = 1024
MAX_CACHE_BYTES = 64 << 30  # a pass's K/V caches (previous frames and the block's) in fp32; universal: 2.4 GiB
MAX_VAE_DIM = 1024  # the video decoder's base width (Wan2.1's VAE: 96; its parameters grow as its square)
MAX_CLIP_TOKENS = 1 << 16  # image-context tokens (CLIP's: 257)


def host_memory() -> int:
    """Bytes of memory this process may use: the machine's physical memory, or a container's (cgroup) limit on it
    where that is lower."""
    physical = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    for limit in ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes"):  # cgroup v2, v1
        try:
            with open(limit) as f:
                text = f.read().strip()
        except OSError:
            continue
        if text.isdigit():
            physical = min(physical, int(text))
    return physical


def require_blocks(blocks: object) -> None:
    """Refuse a --blocks that is not an int >= 1 (a bool is no count)."""
    if isinstance(blocks, bool) or not isinstance(blocks, int) or blocks < 1:
        raise WanTrtError(f"--blocks: expected an int >= 1, got {blocks!r}")


def require_host_room(blocks: int, held: int, holds: str, advice: str) -> None:
    """Refuse, before any work, a command of ``blocks`` blocks that keeps ``held`` bytes in host memory (``holds``:
    what, for the message) when that is more than half this machine's: it would end in the allocator or the
    kernel's out-of-memory killer after the work. ``advice``: what to pass instead."""
    have = host_memory()
    if held > have // 2:
        raise WanTrtError(f"--blocks {blocks}: {holds} in memory, about {held / 2**30:,.1f} GiB, and this machine has "
                          f"{have / 2**30:.1f} GiB; {advice}")


def require_room_for(module: "torch.nn.Module", what: str, fix: str) -> None:
    """Refuse, before any allocation, drawing ``module`` (made on the meta device) in fp32 on this machine when its
    parameters would take more than 80 % of its memory (:func:`host_memory`): it ended in the allocator's traceback
    or the kernel's out-of-memory killer. ``what`` it is, ``fix``: which fields to change."""
    count = sum(p.numel() for p in module.parameters())
    have = host_memory()
    if 4 * count > 0.8 * have:
        raise WanTrtError(f"{what}: {count / 1e9:,.1f} B parameters, {4 * count / 2**30:,.1f} GiB in fp32, and this "
                          f"machine has {have / 2**30:.1f} GiB; {fix}")


def _linear(n_in: int, n_out: int, bias: bool = True) -> int:
    return n_in * n_out + (n_out if bias else 0)


def action_parameters(a: "ActionConfig", dim: int) -> int:
    """Parameters of one action module (keyboard and/or mouse path)."""
    head, window, bias = a.head_dim, a.window_frames, a.qkv_bias
    count = 0
    if a.enable_keyboard:
        count += _linear(a.keyboard_dim_in, a.hidden_size) + _linear(a.hidden_size, a.hidden_size)
        count += 2 * head  # key_attn_q_norm, key_attn_k_norm
        count += _linear(a.img_hidden_size, a.keyboard_hidden_dim, bias)  # mouse_attn_q
        count += _linear(a.hidden_size * window, 2 * a.keyboard_hidden_dim, bias)  # keyboard_attn_kv
        count += _linear(a.keyboard_hidden_dim, a.img_hidden_size, bias)  # proj_keyboard
    if a.enable_mouse:
        c = a.mouse_hidden_dim
        count += _linear(a.mouse_dim_in * window + a.img_hidden_size, c) + _linear(c, c) + 2 * c  # mouse_mlp
        count += _linear(c, 3 * c, bias) + 2 * head + _linear(c, a.img_hidden_size, bias)
    return count


def parameter_count(cfg: "WanConfig") -> int:
    """Parameters of the model ``cfg`` describes, from the field values alone."""
    m = cfg.model
    d, patch = m.dim, math.prod(m.patch_size)
    attention = 4 * _linear(d, d) + 2 * d  # q, k, v, o + q/k RMSNorm weights
    block = 2 * attention + 2 * d + _linear(d, m.ffn_dim) + _linear(m.ffn_dim, d) + 6 * d  # + norm3, modulation
    count = m.num_layers * block + len(cfg.action_layers) * action_parameters(m.action_config, d)
    count += _linear(m.in_dim * patch, d)  # patch_embedding
    count += _linear(m.freq_dim, d) + _linear(d, d) + _linear(d, 6 * d)  # time embedding, projection
    count += _linear(d, patch * m.out_dim) + 2 * d  # head
    count += 2 * m.clip_dim + _linear(m.clip_dim, m.clip_dim) + _linear(m.clip_dim, d) + 2 * d  # img_emb
    return count


def check_sizes(cfg: "WanConfig", where: str) -> None:
    """Refuse a config whose model or tables could not sensibly be allocated; name the fields."""
    m, inf = cfg.model, cfg.inference
    if m.num_layers > MAX_LAYERS:
        raise field_error("num_layers", f"at most {MAX_LAYERS} layers", m.num_layers, where)
    if cfg.tokens_per_frame > MAX_TOKENS_PER_FRAME:
        raise field_error("inference.latent_height/latent_width", f"a latent frame of at most "
                          f"{MAX_TOKENS_PER_FRAME} patches", (inf.latent_height, inf.latent_width), where)
    count = parameter_count(cfg)
    if count > MAX_PARAMETERS:
        a = m.action_config
        raise WanTrtError(
            f"config {where}: the model would hold {count / 1e9:,.0f} B parameters (dim={m.dim}, "
            f"ffn_dim={m.ffn_dim}, num_layers={m.num_layers}, action hidden sizes "
            f"{a.keyboard_hidden_dim}/{a.mouse_hidden_dim}); expected at most {MAX_PARAMETERS / 1e9:.0f} B "
            "(Matrix-Game 2.0 has 1.6 B); fix dim, ffn_dim, num_layers or the action_config sizes in that "
            "file, or pass a preset to --config")
    if inf.vae_dim > MAX_VAE_DIM:
        raise field_error("inference.vae_dim", f"at most {MAX_VAE_DIM} (Wan2.1's VAE: 96; the decoder's parameters "
                          "grow as its square)", inf.vae_dim, where)
    if m.clip_tokens > MAX_CLIP_TOKENS:
        raise field_error("model.clip_tokens", f"at most {MAX_CLIP_TOKENS} (CLIP's: 257)", m.clip_tokens, where)
    if m.local_attn_size > MAX_WINDOW_FRAMES:
        raise field_error("model.local_attn_size", f"a window of at most {MAX_WINDOW_FRAMES} latent frames (the "
                          "presets': 4 to 6)", m.local_attn_size, where)
    from wan_trt.info import cache_bytes  # deferred: info reads the config module this check serves
    caches = sum(cache_bytes(cfg, 4)["total"][k] for k in ("static_prev", "static_cur"))
    if caches > MAX_CACHE_BYTES:
        raise field_error("model.local_attn_size/inference.num_frame_per_block",
                          f"caches of at most {MAX_CACHE_BYTES >> 30} GiB in fp32 (this config's: "
                          f"{caches / 2**30:,.0f} GiB; the universal preset's 2.4)",
                          (cfg.model.local_attn_size, cfg.inference.num_frame_per_block), where)

