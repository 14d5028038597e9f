"""Analytic facts of a config: parameters, tokens, cache sizes, FLOPs per pass and per block.

FLOPs count a multiply-add as 2. One pass has Q = F*S query tokens; self-attention
sees (v + F)*S keys with v valid previous frames (steady state: v = P).
"""
from __future__ import annotations

from typing import Any

from wan_trt.config import WanConfig
from wan_trt.model import count_parameters

BYTES_BF16 = 2


def flops_per_pass(cfg: WanConfig, valid_frames: int | None = None) -> dict[str, float]:
    """FLOPs of one pass by op class: linear, self_attention, cross_attention, action, total."""
    m = cfg.model
    v = cfg.prev_frames if valid_frames is None else valid_frames
    f, s, c, t = cfg.block_frames, cfg.tokens_per_frame, m.dim, m.clip_tokens
    q, keys = f * s, (v + f) * s
    patch = m.patch_size[0] * m.patch_size[1] * m.patch_size[2]
    linear = 2 * q * m.in_dim * patch * c  # patch embedding
    linear += 2 * f * (m.freq_dim * c + c * c + c * 6 * c)  # time embedding + projection
    linear += 2 * t * (m.clip_dim * m.clip_dim + m.clip_dim * c)  # img_emb
    linear += m.num_layers * 2 * (6 * q * c * c + 2 * t * c * c + 2 * q * c * m.ffn_dim)
    linear += 2 * q * c * patch * m.out_dim  # head
    self_attn = m.num_layers * 2 * 2 * q * keys * c
    cross = m.num_layers * 2 * 2 * q * t * c
    action = len(cfg.action_layers) * _action_flops(cfg, v)
    total = linear + self_attn + cross + action
    return {"linear": linear, "self_attention": self_attn, "cross_attention": cross, "action": action,
            "total": total}


def _action_flops(cfg: WanConfig, valid: int) -> float:
    m, a = cfg.model, cfg.model.action_config
    f, s, c, h = cfg.block_frames, cfg.tokens_per_frame, m.dim, a.mouse_hidden_dim
    q, keys = f * s, valid + f
    flops = 0.0
    if cfg.has_mouse:
        flops += 2 * q * ((a.window_frames * a.mouse_dim_in + c) * h + h * h)  # mouse_mlp
        flops += 2 * q * h * 3 * h + 2 * q * h * c  # t_qkv, proj_mouse
        flops += 2 * 2 * q * keys * h  # temporal attention per spatial token
    if cfg.has_keyboard:
        k = a.keyboard_hidden_dim
        flops += 2 * f * a.window_frames * (a.keyboard_dim_in * a.hidden_size + a.hidden_size ** 2)
        flops += 2 * f * a.window_frames * a.hidden_size * 2 * k  # keyboard_attn_kv
        flops += 2 * q * c * k + 2 * q * k * c + 2 * 2 * q * keys * k  # q, proj, attention
    return flops


def cache_bytes(cfg: WanConfig, bytes_per_value: int = BYTES_BF16) -> dict[str, Any]:
    """Per-layer and total cache sizes, upstream rolling form and static form (prev + cur)."""
    m, a = cfg.model, cfg.model.action_config
    s, p, f, local = cfg.tokens_per_frame, cfg.prev_frames, cfg.block_frames, m.local_attn_size
    per_frame = {"self": 2 * s * m.dim}  # k and v, values per latent frame
    layers = {"self": m.num_layers}
    if cfg.has_mouse:
        per_frame["mouse"] = 2 * s * a.mouse_hidden_dim
        layers["mouse"] = len(cfg.action_layers)
    if cfg.has_keyboard:
        per_frame["keyboard"] = 2 * a.keyboard_hidden_dim
        layers["keyboard"] = len(cfg.action_layers)
    out: dict[str, Any] = {"bytes_per_value": bytes_per_value, "per_layer": {}, "total": {}}
    for kind, values in per_frame.items():
        sizes = {"upstream_rolling": local * values, "static_prev": p * values, "static_cur": f * values}
        out["per_layer"][kind] = {k: v * bytes_per_value for k, v in sizes.items()}
        for k, v in sizes.items():
            out["total"][k] = out["total"].get(k, 0) + v * bytes_per_value * layers[kind]
    out["cross_attention_kv"] = {"per_layer": 2 * m.clip_tokens * m.dim * bytes_per_value,
                                 "total": 2 * m.clip_tokens * m.dim * bytes_per_value * m.num_layers}
    return out


def model_info(cfg: WanConfig) -> dict[str, Any]:
    """Everything ``wan-trt info`` prints."""
    per_pass = flops_per_pass(cfg)
    first_pass = flops_per_pass(cfg, valid_frames=0)
    return {
        "config": cfg.name,
        "parameters": count_parameters(cfg),
        "latent_hw": [cfg.inference.latent_height, cfg.inference.latent_width],
        "tokens_per_frame": cfg.tokens_per_frame,
        "frames_per_block": cfg.block_frames,
        "tokens_per_block": cfg.tokens_per_block,
        "prev_frames": cfg.prev_frames,
        "keys_per_pass": (cfg.prev_frames + cfg.block_frames) * cfg.tokens_per_frame,
        "passes_per_block": cfg.passes_per_block,
        "action_layers": list(cfg.action_layers),
        "inputs": {"mouse": cfg.has_mouse, "keyboard": cfg.has_keyboard},
        "caches": cache_bytes(cfg),
        "flops_per_pass": per_pass,
        "flops_per_pass_first_block": first_pass["total"],
        "flops_per_block": per_pass["total"] * cfg.passes_per_block,
        "video_frames_per_block": 4 * cfg.block_frames,
    }


def format_info(info: dict[str, Any]) -> str:
    """Human-readable table of :func:`model_info`."""
    mb = 1024 ** 2
    c = info["caches"]
    lines = [
        f"config              {info['config']}",
        f"parameters          {info['parameters']:,} ({info['parameters'] / 1e9:.3f} B)",
        f"latents (H x W)     {info['latent_hw'][0]} x {info['latent_hw'][1]}",
        f"tokens per frame    {info['tokens_per_frame']}",
        f"tokens per block    {info['tokens_per_block']} ({info['frames_per_block']} latent frames, "
        f"{info['video_frames_per_block']} video frames)",
        f"keys per pass       {info['keys_per_pass']} ({info['prev_frames']} previous frames + the block)",
        f"passes per block    {info['passes_per_block']}",
        f"action layers       {len(info['action_layers'])} "
        f"(mouse {'on' if info['inputs']['mouse'] else 'off'}, keyboard "
        f"{'on' if info['inputs']['keyboard'] else 'off'})",
        "caches (bf16)       per layer: " + ", ".join(
            f"{k} {v['upstream_rolling'] / mb:.2f} MiB upstream / {v['static_prev'] / mb:.2f} MiB static prev"
            for k, v in c["per_layer"].items()),
        f"                    total: upstream {c['total']['upstream_rolling'] / mb:.1f} MiB, static prev "
        f"{c['total']['static_prev'] / mb:.1f} MiB + cur {c['total']['static_cur'] / mb:.1f} MiB, "
        f"cross-attn K/V {c['cross_attention_kv']['total'] / mb:.1f} MiB",
    ]
    f = info["flops_per_pass"]
    lines.append("FLOPs per pass      " + ", ".join(f"{k} {v / 1e12:.3f} T" for k, v in f.items()))
    lines.append(f"FLOPs per block     {info['flops_per_block'] / 1e12:.2f} T "
                 f"({info['passes_per_block']} passes)")
    return "\n".join(lines)
