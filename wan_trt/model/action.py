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

from typing import NamedTuple

import torch
from torch import nn
from torch.nn import functional as F

from wan_trt.config import ActionConfig
from wan_trt.model.layers import ActionRMSNorm, few_key_attention, rms_normalize
from wan_trt.model.rope import apply_rope


KeyboardKV = tuple[torch.Tensor, torch.Tensor]  # one layer's keyboard keys and values, [B, F, Hh, Dh] each


class MouseShare(NamedTuple):
    """The graphs' mouse input of one layer: the raw window's share of its first MLP linear, bias
    included, per frame ([B, F, c]; :class:`MouseWindowProjection`). The reference takes the window."""
    per_frame: torch.Tensor


class ActionModule(nn.Module):
    plugins = False  # fused ops: the keyboard queries' norm + RoPE; the mouse q/k norm + RoPE and few-key
    # attention where the caches allow them

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
            # the fused per-head norms' weight (ActionRMSNorm has none in effect): a constant, not in the state dict
            self.register_buffer("mouse_unit", torch.ones(c), persistent=False)
        if a.enable_keyboard:
            self.key_attn_q_norm = ActionRMSNorm(head_dim)
            self.key_attn_k_norm = ActionRMSNorm(head_dim)
            self.mouse_attn_q = nn.Linear(a.img_hidden_size, a.keyboard_hidden_dim, bias=a.qkv_bias)
            self.keyboard_attn_kv = nn.Linear(a.hidden_size * a.window_frames, 2 * a.keyboard_hidden_dim,
                                              bias=a.qkv_bias)
            self.proj_keyboard = nn.Linear(a.keyboard_hidden_dim, a.img_hidden_size, bias=a.qkv_bias)
            self.register_buffer("keyboard_unit", torch.ones(a.keyboard_hidden_dim), persistent=False)

    def make_units(self, device: str | torch.device, dtype: torch.dtype) -> None:
        """(Re)make the unit weights of the fused norms (constants: neither a checkpoint nor the seeded draw
        fills them). One buffer per layer, where a ``new_ones`` per call was a fill kernel per layer and pass."""
        for name in ("mouse_unit", "keyboard_unit"):
            if hasattr(self, name):
                setattr(self, name, torch.ones(getattr(self, name).shape, dtype=dtype, device=device))

    def forward(self, x: torch.Tensor, frames: int, mouse: torch.Tensor | MouseShare | None,
                keyboard_kv: KeyboardKV | None, cos: torch.Tensor, sin: torch.Tensor,
                caches, layer: int) -> torch.Tensor:
        """x: [B, F*S, C] residual stream; mouse: the raw mouse window [B, F, 12, dim_in] or this layer's
        :class:`MouseShare`; keyboard_kv: this layer's :meth:`keyboard_kv`; cos, sin: [F, ca] action RoPE.
        Returns x with both residuals."""
        x, y = self.last_unsummed(x, frames, mouse, keyboard_kv, cos, sin, caches, layer)
        return x if y is None else x + y.to(x.dtype)

    def keyboard_kv(self, window: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> KeyboardKV:
        """The keyboard attention's keys (normed, rotated) and values of the block: [B, F, Hh, Dh] each.

        They depend on the raw keyboard window only, not on the stream (graphs compute every layer's
        at once: :class:`KeyboardProjection`)."""
        kb = self.keyboard_embed(window.to(self.keyboard_attn_kv.weight.dtype)).flatten(2)  # [B, F, 12*hidden]
        k, v = self.keyboard_attn_kv(kb).unflatten(-1, (2, self.heads, -1)).unbind(2)  # [B, F, Hh, Dh]
        return apply_rope(self.key_attn_k_norm(k), cos[:, None, :], sin[:, None, :]), v

    def last_unsummed(self, x: torch.Tensor, frames: int, mouse: torch.Tensor | MouseShare | None,
                      keyboard_kv: KeyboardKV | None, cos: torch.Tensor, sin: torch.Tensor,
                      caches, layer: int) -> tuple[torch.Tensor, torch.Tensor | None]:
        """As :meth:`forward`, but the last branch's output is returned beside x instead of added to it
        (the fused layer adds it inside its next norm); None without branches."""
        cdt = next(self.parameters()).dtype
        y = None
        if self.enable_mouse:
            y = self._mouse(x.to(cdt), frames, mouse, cos, sin, caches, layer)
        if self.enable_keyboard:
            if y is not None:  # the keyboard branch reads the sum
                x = x + y.to(x.dtype)
            y = self._keyboard(x.to(cdt), frames, keyboard_kv, cos, sin, caches, layer)
        return x, y

    def _mouse(self, x, frames, mouse, cos, sin, caches, layer):
        b, length, _ = x.shape
        s = length // frames
        tokens = x.unflatten(1, (frames, s)).transpose(1, 2).reshape(b * s, frames, -1)  # [B*S, F, C]
        if isinstance(mouse, MouseShare):  # graphs: the first linear reads the tokens, the window's share is added
            h = self.mouse_mlp[0](tokens).unflatten(0, (b, s)) + mouse.per_frame[:, None]  # [B, S, F, c]
            hidden = self.mouse_mlp[1:](h.flatten(0, 1))
        else:  # the first linear reads [tokens ; window features] of every token
            feats = mouse.to(x.dtype).flatten(2)  # [B, F, 12*mouse_dim]
            feats = feats[:, None].expand(b, s, frames, feats.shape[-1]).reshape(b * s, frames, -1)
            hidden = self.mouse_mlp(torch.cat([tokens, feats], dim=-1))
        qkv = self.t_qkv(hidden)  # [B*S, F, 3c]
        if self.plugins and caches.segments("mouse", layer) is not None:
            # per-head norm + RoPE of q and k in one kernel that reads them inside qkv
            c = qkv.shape[-1] // 3
            unit = self.mouse_unit.to(qkv.dtype)
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

    def _keyboard(self, x, frames, kv, cos, sin, caches, layer):
        b, length, _ = x.shape
        s = length // frames
        q = self.mouse_attn_q(x)  # [B, F*S, Hh*Dh]
        if self.plugins:  # per-head norm + RoPE in one kernel, a frame's rotation over its S rows
            head_dim = q.shape[-1] // self.heads
            q = torch.ops.wan_trt.norm_rope(q, self.keyboard_unit.to(q.dtype), cos, sin, self.key_attn_q_norm.eps,
                                            head_dim)
            q = q.unflatten(-1, (self.heads, -1))  # [B, F*S, Hh, Dh]
        else:
            q = self.key_attn_q_norm(q.unflatten(-1, (self.heads, -1))).unflatten(1, (frames, s))  # [B, F, S, Hh, Dh]
            q = apply_rope(q, cos[:, None, None, :], sin[:, None, None, :]).flatten(1, 2)
        out = self._attend("keyboard", q, *kv, caches, layer)  # [B, F*S, Hh, Dh]
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


class KeyboardProjection(nn.Module):
    """Every action layer's :meth:`ActionModule.keyboard_kv` at once: the graphs' form.

    The same arithmetic per element as the layers' own modules, as batched products over the layers
    (one GEMM for the embeddings' first linears, which share their input, then two batched GEMMs):
    per layer and pass the keyboard path otherwise runs three GEMMs of 3 to 36 rows and a handful of
    elementwise kernels, launches that keep the GPU a fraction busy. The layers' keyboard embedding,
    k/v linear and k norm move here (:meth:`CausalWanModel.fuse_keyboard_projections`); their queries'
    and outputs' projections stay (they read the stream).
    """

    def __init__(self, modules: dict[int, ActionModule]):
        super().__init__()
        self.layers = list(modules)
        first = modules[self.layers[0]]
        self.heads, self.eps = first.heads, first.key_attn_k_norm.eps
        embeds = [m.keyboard_embed for m in modules.values()]  # Linear, SiLU, Linear
        kvs = [m.keyboard_attn_kv for m in modules.values()]
        with torch.no_grad():
            self.register_buffer("embed_weight", torch.cat([e[0].weight for e in embeds]))  # [L*h, K]
            self.register_buffer("embed_bias", torch.cat([e[0].bias for e in embeds]))
            self.register_buffer("hidden_weight", torch.stack([e[2].weight.t() for e in embeds]))  # [L, h, h]
            self.register_buffer("hidden_bias", torch.stack([e[2].bias for e in embeds])[:, None])  # [L, 1, h]
            self.register_buffer("kv_weight", torch.stack([m.weight.t() for m in kvs]))  # [L, 12 h, 2 c]
            kv_bias = None if kvs[0].bias is None else torch.stack([m.bias for m in kvs])[:, None]  # [L, 1, 2 c]
            self.register_buffer("kv_bias", kv_bias)

    def forward(self, window: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> dict[int, KeyboardKV]:
        """window [B, F, 12, K]; cos, sin [F, ca] -> {layer: (k, v)} as :meth:`ActionModule.keyboard_kv`."""
        layers, hidden = self.hidden_weight.shape[:2]
        b, f, w, _ = window.shape
        h = F.silu(F.linear(window.to(self.embed_weight.dtype), self.embed_weight, self.embed_bias))  # [B, F, 12, L*h]
        h = h.reshape(b * f * w, layers, hidden).transpose(0, 1)  # [L, B*F*12, h]
        h = torch.baddbmm(self.hidden_bias, h, self.hidden_weight)  # keyboard_embed's second linear
        h = h.reshape(layers, b * f, w * hidden)
        kv = torch.bmm(h, self.kv_weight) if self.kv_bias is None else torch.baddbmm(self.kv_bias, h, self.kv_weight)
        k, v = kv.unflatten(1, (b, f)).unflatten(-1, (2, self.heads, -1)).unbind(-3)  # [L, B, F, Hh, Dh]
        k = apply_rope(rms_normalize(k, self.eps), cos[:, None, :], sin[:, None, :])
        v = v.contiguous()  # each layer's a dense slice: the graph's cache outputs need no copy of their own
        return {layer: (k[i], v[i]) for i, layer in enumerate(self.layers)}


class MouseWindowProjection(nn.Module):
    """Every mouse layer's first MLP linear, split where its input concatenates [tokens ; window
    features]: the graphs' form.

    The window's features are the same for every token of a frame, so their share of the product (bias
    included) is computed once per frame for all layers in one GEMM, and each layer's linear keeps its
    token columns only (a [C, c] GEMM without bias; the share is added where the GELU reads it). No
    token-sized concatenation, and the GEMM's inner dim is the model width instead of width + 24. In bf16 the
    two products are rounded before they are added, where the joined GEMM rounds once: not bit-equal to the
    reference (the engine's check measured the same flow error as before the split).
    """

    def __init__(self, modules: dict[int, ActionModule], tokens_dim: int):
        super().__init__()
        self.layers = list(modules)
        linears = [m.mouse_mlp[0] for m in modules.values()]
        with torch.no_grad():
            self.register_buffer("weight", torch.cat([lin.weight[:, tokens_dim:] for lin in linears]))  # [L*c, W]
            self.register_buffer("bias", torch.cat([lin.bias for lin in linears]))

    @staticmethod
    @torch.no_grad()
    def tokens_only(linear: nn.Linear, tokens_dim: int) -> nn.Linear:
        """The layer's first linear without the window's columns and the bias (which the projection holds)."""
        kept = nn.Linear(tokens_dim, linear.out_features, bias=False, device=linear.weight.device,
                         dtype=linear.weight.dtype)
        kept.weight.copy_(linear.weight[:, :tokens_dim])
        return kept

    def forward(self, window: torch.Tensor) -> dict[int, MouseShare]:
        """window [B, F, 12, dim_in] -> {layer: MouseShare [B, F, c]}."""
        share = F.linear(window.to(self.weight.dtype).flatten(2), self.weight, self.bias)
        share = share.unflatten(-1, (len(self.layers), -1))  # [B, F, L, c]
        return {layer: MouseShare(share[..., i, :]) for i, layer in enumerate(self.layers)}
