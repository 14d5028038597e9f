"""The action module (mouse and keyboard conditioning), upstream parameter names.

Inputs per block of F latent frames: ``mouse_window`` [B, F, 12, mouse_dim] and
``keyboard_window`` [B, F, 12, kb_dim], the raw action frames each latent frame sees
(see :mod:`wan_trt.stream`, ``ActionHistory``).

Mouse path, per spatial token s (batch B*S, sequence = frames):
    h = mouse_mlp(cat(x[s, f], mouse_window[f].flatten()))          # [B*S, F, c]
    q, k, v = split(t_qkv(h)); q, k = rms(q), rms(k); RoPE(frame)
    x += proj_mouse(attn(q, [cached k ; k], [cached v ; v]))
Keyboard path (every token sees the same few keys):
    kb = keyboard_embed(keyboard_window).flatten(12 x hidden)        # [B, F, 12*hidden]
    q = rms(mouse_attn_q(x)); k, v = split(keyboard_attn_kv(kb)); k = rms(k); RoPE(frame)
    x += proj_keyboard(attn(q, [cached k ; k], [cached v ; v]))
"""
from __future__ import annotations

import torch
from torch import nn

from wan_trt.config import ActionConfig
from wan_trt.model.layers import ActionRMSNorm, few_key_attention
from wan_trt.model.rope import apply_rope


class ActionModule(nn.Module):
    plugins = False  # the fused ops (few-key attention, qk norm + RoPE) where the caches allow them

    def __init__(self, a: ActionConfig):
        super().__init__()
        self.enable_mouse = a.enable_mouse
        self.enable_keyboard = a.enable_keyboard
        self.heads = a.heads_num
        head_dim = a.head_dim
        if a.enable_keyboard:
            self.keyboard_embed = nn.Sequential(
                nn.Linear(a.keyboard_dim_in, a.hidden_size), nn.SiLU(), nn.Linear(a.hidden_size, a.hidden_size))
        if a.enable_mouse:
            c = a.mouse_hidden_dim
            self.mouse_mlp = nn.Sequential(
                nn.Linear(a.mouse_dim_in * a.window_frames + a.img_hidden_size, c), nn.GELU(approximate="tanh"),
                nn.Linear(c, c), nn.LayerNorm(c))
            self.t_qkv = nn.Linear(c, 3 * c, bias=a.qkv_bias)
            self.img_attn_q_norm = ActionRMSNorm(head_dim)
            self.img_attn_k_norm = ActionRMSNorm(head_dim)
            self.proj_mouse = nn.Linear(c, a.img_hidden_size, bias=a.qkv_bias)
        if a.enable_keyboard:
            self.key_attn_q_norm = ActionRMSNorm(head_dim)
            self.key_attn_k_norm = ActionRMSNorm(head_dim)
            self.mouse_attn_q = nn.Linear(a.img_hidden_size, a.keyboard_hidden_dim, bias=a.qkv_bias)
            self.keyboard_attn_kv = nn.Linear(a.hidden_size * a.window_frames, 2 * a.keyboard_hidden_dim,
                                              bias=a.qkv_bias)
            self.proj_keyboard = nn.Linear(a.keyboard_hidden_dim, a.img_hidden_size, bias=a.qkv_bias)

    def forward(self, x: torch.Tensor, frames: int, mouse_window: torch.Tensor | None,
                keyboard_window: torch.Tensor | None, cos: torch.Tensor, sin: torch.Tensor,
                caches, layer: int) -> torch.Tensor:
        """x: [B, F*S, C] residual stream; cos, sin: [F, ca] action RoPE. Returns x with both residuals."""
        x, y = self.last_unsummed(x, frames, mouse_window, keyboard_window, cos, sin, caches, layer)
        return x if y is None else x + y.to(x.dtype)

    def last_unsummed(self, x: torch.Tensor, frames: int, mouse_window: torch.Tensor | None,
                      keyboard_window: torch.Tensor | None, cos: torch.Tensor, sin: torch.Tensor,
                      caches, layer: int) -> tuple[torch.Tensor, torch.Tensor | None]:
        """As :meth:`forward`, but the last branch's output is returned beside x instead of added to it
        (the fused layer adds it inside its next norm); None without branches."""
        cdt = next(self.parameters()).dtype
        y = None
        if self.enable_mouse:
            y = self._mouse(x.to(cdt), frames, mouse_window, cos, sin, caches, layer)
        if self.enable_keyboard:
            if y is not None:  # the keyboard branch reads the sum
                x = x + y.to(x.dtype)
            y = self._keyboard(x.to(cdt), frames, keyboard_window, cos, sin, caches, layer)
        return x, y

    def _mouse(self, x, frames, window, cos, sin, caches, layer):
        b, length, _ = x.shape
        s = length // frames
        tokens = x.unflatten(1, (frames, s)).transpose(1, 2).reshape(b * s, frames, -1)  # [B*S, F, C]
        feats = window.to(x.dtype).flatten(2)  # [B, F, 12*mouse_dim]
        feats = feats[:, None].expand(b, s, frames, feats.shape[-1]).reshape(b * s, frames, -1)
        qkv = self.t_qkv(self.mouse_mlp(torch.cat([tokens, feats], dim=-1)))  # [B*S, F, 3c]
        if self.plugins and caches.segments("mouse", layer) is not None:
            # per-head norm + RoPE of q and k in one kernel that reads them inside qkv
            c = qkv.shape[-1] // 3
            unit = qkv.new_ones(c)  # ActionRMSNorm has no weight in effect
            q, k = torch.ops.wan_trt.qk_norm_rope(qkv[..., :c], qkv[..., c:2 * c], unit, unit, cos, sin,
                                                  self.img_attn_q_norm.eps, c // self.heads)
            q, k, v = (t.unflatten(-1, (self.heads, -1)) for t in (q, k, qkv[..., 2 * c:]))  # [B*S, F, Hh, Dh]
        else:
            q, k, v = qkv.unflatten(-1, (3, self.heads, -1)).unbind(2)  # each [B*S, F, Hh, Dh]
            rope_cos, rope_sin = cos[:, None, :], sin[:, None, :]  # [F, 1, ca]
            q = apply_rope(self.img_attn_q_norm(q), rope_cos, rope_sin)
            k = apply_rope(self.img_attn_k_norm(k), rope_cos, rope_sin)
        out = self._attend("mouse", q, k, v, caches, layer)  # [B*S, F, Hh, Dh]
        out = out.reshape(b, s, frames, -1).transpose(1, 2).reshape(b, frames * s, -1)
        return self.proj_mouse(out)

    def _keyboard(self, x, frames, window, cos, sin, caches, layer):
        b, length, _ = x.shape
        s = length // frames
        kb = self.keyboard_embed(window.to(x.dtype)).flatten(2)  # [B, F, 12*hidden]
        q = self.mouse_attn_q(x).unflatten(-1, (self.heads, -1))  # [B, F*S, Hh, Dh]
        k, v = self.keyboard_attn_kv(kb).unflatten(-1, (2, self.heads, -1)).unbind(2)  # [B, F, Hh, Dh]
        q = self.key_attn_q_norm(q).unflatten(1, (frames, s))  # [B, F, S, Hh, Dh]
        q = apply_rope(q, cos[:, None, None, :], sin[:, None, None, :]).flatten(1, 2)
        k = apply_rope(self.key_attn_k_norm(k), cos[:, None, :], sin[:, None, :])
        out = self._attend("keyboard", q, k, v, caches, layer)  # [B, F*S, Hh, Dh]
        return self.proj_keyboard(out.flatten(2))

    def _attend(self, kind, q, k, v, caches, layer):
        """q over [the cached keys of ``kind`` ; k]: one fused kernel reading the cache where it is
        (plugins, static caches with previous frames), else the concatenated window in fp32 einsums."""
        segments = caches.segments(kind, layer) if self.plugins else None
        if segments is None:
            k_all, v_all, key_valid = caches.window(kind, layer, k, v)
            return few_key_attention(q, k_all, v_all, key_valid)
        caches.record(kind, layer, k, v)
        k_prev, v_prev, valid, prev_frames, units = segments
        return torch.ops.wan_trt.few_key_attention(q, k_prev, v_prev, k, v, valid, prev_frames, units)
