"""CausalWanModel: the Matrix-Game 2.0 causal DiT, module and parameter names as upstream.

One call runs one denoising pass over one block of F latent frames:

    latents [B, 16, F, H, W], cond_concat [B, 20, F, H, W] --Conv3d(1,2,2)--> x [B, F*S, C]
    t [B, F] -> sinusoid(fp64) -> time_embedding -> e [B*F, C] -> time_projection -> e0 [B, F, 6, C]
    per layer (shift, scale, gate from modulation + e0, broadcast over each frame's S tokens):
        x += self_attn(LN(x) * (1 + scale_a) + shift_a) * gate_a     # RMSNorm q,k; 3D RoPE; cache window
        x += cross_attn(LN_affine(x), image context)
        x  = action_model(x)                                         # configured layers only
        x += ffn(LN(x) * (1 + scale_f) + shift_f) * gate_f
    head: LN(x) * (1 + scale) + shift -> Linear(C, 64) -> unpatchify -> flow [B, 16, F, H, W]

The KV cache form is the caller's choice (:mod:`wan_trt.model.caches`).
"""
from __future__ import annotations

import math
from typing import NamedTuple, Sequence

import torch
from torch import nn
from torch.nn import functional as F

from wan_trt.config import WanConfig
from wan_trt.model.action import ActionModule, KeyboardKV, KeyboardProjection, MouseShare, MouseWindowProjection
from wan_trt.model.fp8 import Fp8Linear, quantize_rows, use_fp8
from wan_trt.model.layers import (MLPProj, WanLayerNorm, WanRMSNorm, attention, rms_normalize,
                                  sinusoidal_embedding_1d)
from wan_trt.model.rope import BlockRope, RopeTables, apply_rope

ContextKV = Sequence[tuple[torch.Tensor, torch.Tensor]]


class WanAttention(nn.Module):
    """q, k, v, o projections and the q/k RMSNorms shared by self- and cross-attention (upstream names)."""

    def __init__(self, dim: int, num_heads: int, eps: float):
        super().__init__()
        self.num_heads = num_heads
        self.eps = eps
        self.q = nn.Linear(dim, dim)
        self.k = nn.Linear(dim, dim)
        self.v = nn.Linear(dim, dim)
        self.o = nn.Linear(dim, dim)
        self.norm_q = WanRMSNorm(dim, eps=eps)
        self.norm_k = WanRMSNorm(dim, eps=eps)


class CausalWanSelfAttention(WanAttention):
    plugins = False  # fused wan_trt ops (qk-norm + RoPE, window attention) instead of PyTorch ops

    def forward(self, x, cos, sin, caches, layer):
        """x: [B, L, C]; cos, sin: [L, c] main RoPE of the block."""
        segments = caches.segments("self", layer) if self.plugins else None
        if segments is not None:
            return self._fused(x, cos, sin, caches, layer, segments)
        q = self.norm_q(self.q(x)).unflatten(-1, (self.num_heads, -1))  # [B, L, H, D]
        k = self.norm_k(self.k(x)).unflatten(-1, (self.num_heads, -1))
        v = self.v(x).unflatten(-1, (self.num_heads, -1))
        q = apply_rope(q, cos[:, None, :], sin[:, None, :])
        k = apply_rope(k, cos[:, None, :], sin[:, None, :])
        k_all, v_all, key_valid = caches.window("self", layer, k, v)
        return self.o(attention(q, k_all, v_all, key_valid).flatten(2))

    def _fused(self, x, cos, sin, caches, layer, segments):
        ops = torch.ops.wan_trt
        q, k = ops.qk_norm_rope(self.q(x), self.k(x), self.norm_q.weight, self.norm_k.weight, cos, sin, self.eps,
                                x.shape[-1])
        q, k = (t.unflatten(-1, (self.num_heads, -1)) for t in (q, k))
        v = self.v(x).unflatten(-1, (self.num_heads, -1))
        caches.record("self", layer, k, v)
        k_prev, v_prev, valid, prev_frames, units = segments
        return self.o(ops.window_attention(q, k_prev, v_prev, k, v, valid, prev_frames, units).flatten(2))


class WanI2VCrossAttention(WanAttention):
    """Attention of the block's tokens over the projected CLIP image tokens (no RoPE)."""

    def context_kv(self, context: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """context [B, 257, C] -> k, v [B, 257, H, D] (constant for a whole stream)."""
        k = self.norm_k(self.k(context)).unflatten(-1, (self.num_heads, -1))
        return k, self.v(context).unflatten(-1, (self.num_heads, -1))

    def forward(self, x, kv):
        q = self.norm_q(self.q(x)).unflatten(-1, (self.num_heads, -1))
        return self.o(attention(q, kv[0], kv[1]).flatten(2))


class ContextProjection(nn.Module):
    """Every layer's cross-attention k and v projection, and k's RMS normalisation, as one GEMM and one norm.

    The graphs' form of :meth:`CausalWanModel.encode_context`
    (:meth:`CausalWanModel.fuse_context_projections`): one [T, C] x [C, 2 L C] GEMM and one
    normalisation over all L layers' k, where the layers' own modules run 2 L GEMMs of [T, C] x [C, C]
    and L norms over the 257 context tokens, small launches that keep the GPU a fraction busy. Rows of
    ``weight``: layer 0's k, layer 0's v, layer 1's k, ...

    k's learned norm weight moves to the query side: each layer's ``norm_q`` weight becomes its own
    times ``norm_k``'s (per channel, so every score q . k is the same sum), and k leaves as a plain
    normalisation of all layers at once. With the fused ops that is one ``norm_rope`` kernel with the
    identity rotation (cos 1, sin 0: exact) whose output each layer's attention reads in place; as
    PyTorch ops, Inductor recomputed the weighted norm into a copy per layer (30 launches a pass).
    """

    plugins = False  # the norm as the fused norm_rope op

    def __init__(self, layers: Sequence[WanI2VCrossAttention]):
        super().__init__()
        self.num_heads, self.eps = layers[0].num_heads, layers[0].norm_k.eps
        with torch.no_grad():
            self.register_buffer("weight", torch.cat([w for a in layers for w in (a.k.weight, a.v.weight)]))
            self.register_buffer("bias", torch.cat([b for a in layers for b in (a.k.bias, a.v.bias)]))
            for a in layers:  # in fp32, rounded once to the weight's dtype; a new tensor, never written in place
                # (a loaded checkpoint's tensors are the model's: tied ones would be folded twice)
                q = a.norm_q.weight
                a.norm_q.weight = nn.Parameter((q.float() * a.norm_k.weight.float()).to(q.dtype), requires_grad=False)
        # norm_rope's operands: a unit weight, fp32 tables of the identity rotation
        dim, device = self.weight.shape[1], self.weight.device
        self.register_buffer("unit", torch.ones(dim, dtype=self.weight.dtype, device=device), persistent=False)
        self.register_buffer("identity_cos", torch.ones(1, dim // self.num_heads // 2, device=device), persistent=False)
        self.register_buffer("identity_sin", torch.zeros_like(self.identity_cos), persistent=False)

    def forward(self, context: torch.Tensor) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """context [B, T, C] -> per layer (k normalised without weight, v) [B, T, H, D]."""
        layers = self.weight.shape[0] // (2 * context.shape[-1])
        kv = F.linear(context, self.weight, self.bias).unflatten(-1, (layers, 2, -1))  # [B, T, L, 2, C]
        k = self._normalize(kv[..., 0, :])  # [B, T, L, C]
        heads = (self.num_heads, -1)
        return [(k[..., i, :].unflatten(-1, heads), kv[..., i, 1, :].unflatten(-1, heads)) for i in range(layers)]

    def _normalize(self, k: torch.Tensor) -> torch.Tensor:
        """k [B, T, L, C] (a view into the GEMM's output) normalised over C, every layer in one pass."""
        if not self.plugins:
            return rms_normalize(k, self.eps)
        rows = k.flatten(1, 2)  # [B, T * L, C]: evenly strided rows inside the GEMM's output
        out = torch.ops.wan_trt.norm_rope(rows, self.unit.to(rows.dtype), self.identity_cos.float(),
                                          self.identity_sin.float(), self.eps, rows.shape[-1])
        return out.unflatten(1, k.shape[1:3])


class AdalnOperands(NamedTuple):
    """One layer's operands of its fused adaLN norms, [B, F, 1, C] each: the self-attention's norm
    (``shift_a``, ``a_a`` = 1 + scale, ``gate_a``) and the FFN's (``shift_f``, ``a_f``, ``gate_f``)."""
    shift_a: torch.Tensor
    a_a: torch.Tensor
    gate_a: torch.Tensor
    shift_f: torch.Tensor
    a_f: torch.Tensor
    gate_f: torch.Tensor

    @classmethod
    def of(cls, mods: torch.Tensor) -> "AdalnOperands":
        """From one layer's ``modulation + e0`` [B, F, 6, C] (the slots in upstream's order)."""
        shift_a, scale_a, gate_a, shift_f, scale_f, gate_f = mods.chunk(6, dim=2)
        return cls(shift_a, 1 + scale_a, gate_a, shift_f, 1 + scale_f, gate_f)


class ModulationTable(nn.Module):
    """Every layer's adaLN operands of a pass as views of one [L, B, F, 6, C] table (graphs' form with the
    fused ops, :meth:`CausalWanModel.stack_modulations`): each layer's modulation plus the pass's e0, with
    the scale slots' 1 added in the same kernel, where each layer computed its own ``modulation + e0`` and
    every fused norm its own ``1 + scale`` (about three small kernels a layer and pass). The layers keep
    their ``modulation`` (the PyTorch ops' path reads it)."""

    SCALE_SLOTS = (1, 4)  # scale_a, scale_f in upstream's [shift_a, scale_a, gate_a, shift_f, scale_f, gate_f]

    def __init__(self, blocks: Sequence[nn.Module]):
        super().__init__()
        with torch.no_grad():
            weight = torch.cat([b.modulation for b in blocks])  # [L, 6, C]
            ones = torch.zeros(6, 1, dtype=weight.dtype, device=weight.device)
            ones[list(self.SCALE_SLOTS)] = 1
        self.register_buffer("weight", weight)
        self.register_buffer("ones_at_scales", ones, persistent=False)

    def forward(self, e0: torch.Tensor) -> list[AdalnOperands]:
        """e0 [B, F, 6, C] -> per layer its :class:`AdalnOperands` (views of the table)."""
        table = self.weight[:, None, None] + e0[None] + self.ones_at_scales  # [L, B, F, 6, C]
        return [AdalnOperands(*layer.split(1, dim=2)) for layer in table]


def modulate(x: torch.Tensor, shift: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """x: [B, F*S, C]; shift, scale: [B, F, 1, C] -> x * (1 + scale) + shift per frame."""
    frames = shift.shape[1]
    return (x.unflatten(1, (frames, -1)) * (1 + scale) + shift).flatten(1, 2)


def gated(y: torch.Tensor, gate: torch.Tensor) -> torch.Tensor:
    """y: [B, F*S, C]; gate: [B, F, 1, C] -> y * gate per frame."""
    return (y.unflatten(1, (gate.shape[1], -1)) * gate).flatten(1, 2)


class Residual(NamedTuple):
    """The residual stream of the fused layers with its last branch not yet added: x + y * gate, the gate
    per frame ([B, F, 1, C]) or a [C] vector of ones (an ungated branch). The next norm adds it in its own
    pass over the stream (``add_adaln``), so the sum is never a separate read and write of the stream."""
    x: torch.Tensor
    y: torch.Tensor
    gate: torch.Tensor

    def total(self) -> torch.Tensor:
        y, gate = self.y.to(self.x.dtype), self.gate.to(self.x.dtype)
        return self.x + (y * gate if gate.ndim == 1 else gated(y, gate))


def fused_adaln(x: torch.Tensor | Residual, a: torch.Tensor, c: torch.Tensor, frames: int, eps: float
                ) -> tuple[torch.Tensor, torch.Tensor]:
    """(the residual stream, LN(it) * a[f] + c[f]) by the fused ops, a pending branch added in the same pass."""
    ops = torch.ops.wan_trt
    if isinstance(x, Residual):
        return ops.add_adaln(x.x, x.y, x.gate, a, c, frames, eps)
    return x, ops.adaln(x, a, c, frames, eps)


class CausalWanAttentionBlock(nn.Module):
    plugins = False  # fused adaLN ops instead of PyTorch ops

    def __init__(self, cfg: WanConfig, layer: int):
        super().__init__()
        m = cfg.model
        self.layer = layer
        self.norm1 = WanLayerNorm(m.dim, m.eps)
        self.self_attn = CausalWanSelfAttention(m.dim, m.num_heads, m.eps)
        self.norm3 = WanLayerNorm(m.dim, m.eps, elementwise_affine=True)
        self.cross_attn = WanI2VCrossAttention(m.dim, m.num_heads, m.eps)
        self.norm2 = WanLayerNorm(m.dim, m.eps)
        self.ffn = nn.Sequential(nn.Linear(m.dim, m.ffn_dim), nn.GELU(approximate="tanh"),
                                 nn.Linear(m.ffn_dim, m.dim))
        self.modulation = nn.Parameter(torch.randn(1, 6, m.dim) / m.dim ** 0.5)
        self.action_model = ActionModule(m.action_config) if layer in cfg.action_layers else None
        # the gate of the fused form's ungated branches (Residual); not a weight (not in the state dict)
        self.register_buffer("unit_gate", torch.ones(m.dim), persistent=False)

    def forward(self, x, e0, context_kv, rope_main, rope_action, mouse, keyboard_kv, caches,
                operands: AdalnOperands | None = None):
        """x: [B, F*S, C] residual stream (fused: or a :class:`Residual`); e0: [B, F, 6, C]; ``operands``: the
        fused norms' (a :class:`ModulationTable`'s), else made here. Sublayers run in the weights' dtype."""
        if self.plugins:
            operands = operands or AdalnOperands.of(self.modulation.unsqueeze(1) + e0)
            return self._fused(x, operands, context_kv, rope_main, rope_action, mouse, keyboard_kv, caches)
        mods = (self.modulation.unsqueeze(1) + e0).chunk(6, dim=2)  # each [B, F, 1, C]
        cdt, rdt = self.modulation.dtype, x.dtype
        shift_a, scale_a, gate_a, shift_f, scale_f, gate_f = (m.to(rdt) for m in mods)
        y = self.self_attn(modulate(self.norm1(x), shift_a, scale_a).to(cdt), *rope_main, caches, self.layer)
        x = x + gated(y.to(rdt), gate_a)
        x = x + self.cross_attn(self.norm3(x).to(cdt), context_kv).to(rdt)
        if self.action_model is not None:
            x = self.action_model(x, e0.shape[1], mouse, keyboard_kv, *rope_action, caches, self.layer)
        y = self.ffn(modulate(self.norm2(x), shift_f, scale_f).to(cdt))
        return x + gated(y.to(rdt), gate_f)

    def _fused(self, x, operands: AdalnOperands, context_kv, rope_main, rope_action, mouse, keyboard_kv, caches):
        """The same layer with the fused adaLN ops: a branch's residual add happens inside the norm that reads
        the sum (``add_adaln``), unless the next branch reads it (the action module's). ``x`` may be the
        previous layer's :class:`Residual`; returns one."""
        ops, frames, eps = torch.ops.wan_trt, operands.a_a.shape[1], self.norm1.eps
        shift_a, a_a, gate_a, shift_f, a_f, gate_f = operands
        x, h = fused_adaln(x, a_a, shift_a, frames, eps)
        y = self.self_attn(h, *rope_main, caches, self.layer)
        x, h = ops.add_adaln(x, y, gate_a, self.norm3.weight, self.norm3.bias, frames, self.norm3.eps)
        x = Residual(x, self.cross_attn(h, context_kv), self.unit_gate)
        if self.action_model is not None:  # its first branch reads the sum
            x, y = self.action_model.last_unsummed(x.total(), frames, mouse, keyboard_kv, *rope_action,
                                                   caches, self.layer)
            x = x if y is None else Residual(x, y, self.unit_gate)
        x, h = fused_adaln(x, a_f, shift_f, frames, eps)
        return Residual(x, self._ffn_fused(h), gate_f)

    def _ffn_fused(self, h: torch.Tensor) -> torch.Tensor:
        """The FFN with, on CUDA, the up-projection's bias and tanh GELU in the GEMM's epilogue (cuBLASLt
        through aten._addmm_activation: one kernel instead of a GEMM and a pass over its [L, ffn_dim]
        output). Not on CPU, where that op's GELU is the exact (erf) one, not the model's."""
        if not h.is_cuda:
            return self.ffn(h)
        up, down = self.ffn[0], self.ffn[2]
        if isinstance(up, Fp8Linear):  # FP8: the GELU goes into the down-projection's quantization kernel
            return down(quantize_rows(up(h), gelu=True))
        y = torch._addmm_activation(up.bias, h.flatten(0, -2), up.weight.t(), use_gelu=True)
        return down(y.unflatten(0, h.shape[:-1]))


class CausalHead(nn.Module):
    plugins = False  # fused adaLN op instead of PyTorch ops

    def __init__(self, dim: int, out_dim: int, patch_size: Sequence[int], eps: float):
        super().__init__()
        self.norm = WanLayerNorm(dim, eps)
        self.head = nn.Linear(dim, math.prod(patch_size) * out_dim)
        self.modulation = nn.Parameter(torch.randn(1, 2, dim) / dim ** 0.5)

    def forward(self, x: "torch.Tensor | Residual", e: torch.Tensor) -> torch.Tensor:
        """x: [B, F*S, C]; e: [B, F, 1, C] -> [B, F*S, prod(patch) * out_dim]."""
        if self.plugins:  # x may be the last layer's Residual
            shift, scale = (self.modulation.unsqueeze(1) + e).chunk(2, dim=2)
            return self.head(fused_adaln(x, 1 + scale, shift, e.shape[1], self.norm.eps)[1])
        shift, scale = (self.modulation.unsqueeze(1) + e).to(x.dtype).chunk(2, dim=2)
        return self.head(modulate(self.norm(x), shift, scale).to(self.head.weight.dtype))


class CausalWanModel(nn.Module):
    """The causal DiT. ``state_dict()`` keys equal upstream's (without the ``model.`` prefix), until a graph's
    ``prepare`` rearranges the module (:meth:`fuse_context_projections`, :meth:`fuse_keyboard_projections`,
    :meth:`split_mouse_inputs`).

    Precision: sublayers run in the weights' dtype with fp32 islands (norm statistics, RoPE);
    the residual stream is fp32 when the weights are fp16 (fp16 overflows in video DiTs) and
    the weights' dtype otherwise (bf16 as upstream). ``sinusoid_dtype`` is float64 as upstream;
    graphs set float32 (TensorRT has no float64 math).
    """

    sinusoid_dtype: torch.dtype = torch.float64

    def __init__(self, cfg: WanConfig):
        super().__init__()
        m = cfg.model
        self.cfg = cfg
        self.patch_embedding = nn.Conv3d(m.in_dim, m.dim, kernel_size=m.patch_size, stride=m.patch_size)
        self.time_embedding = nn.Sequential(nn.Linear(m.freq_dim, m.dim), nn.SiLU(), nn.Linear(m.dim, m.dim))
        self.time_projection = nn.Sequential(nn.SiLU(), nn.Linear(m.dim, 6 * m.dim))
        self.blocks = nn.ModuleList(CausalWanAttentionBlock(cfg, i) for i in range(m.num_layers))
        self.head = CausalHead(m.dim, m.out_dim, m.patch_size, m.eps)
        self.img_emb = MLPProj(m.clip_dim, m.dim)
        self.rope = RopeTables(cfg)
        self.context_projection: ContextProjection | None = None  # see fuse_context_projections
        self.keyboard_projection: KeyboardProjection | None = None  # see fuse_keyboard_projections
        self.mouse_projection: MouseWindowProjection | None = None  # see split_mouse_inputs
        self.modulation_table: ModulationTable | None = None  # see stack_modulations

    @property
    def dtype(self) -> torch.dtype:
        return self.patch_embedding.weight.dtype

    def use_plugins(self, enabled: bool = True) -> "CausalWanModel":
        """Run with the fused wan_trt ops (Triton kernels / TensorRT plugins) instead of PyTorch ops.

        Only the static-cache form has fused attention (the rolling caches keep PyTorch attention).
        """
        if enabled:
            import wan_trt.plugins.ops  # noqa: F401  (registers torch.ops.wan_trt.*)
        for module in self.modules():
            if hasattr(type(module), "plugins"):
                module.plugins = enabled
        return self

    def make_unit_gates(self, device: str | torch.device, dtype: torch.dtype) -> "CausalWanModel":
        """(Re)make the layers' unit gates and the action modules' unit weights: constants, not weights, so
        neither a checkpoint nor the seeded draw fills them (a model made on the meta device has none until
        this)."""
        for block in self.blocks:
            block.unit_gate = torch.ones(block.unit_gate.shape, dtype=dtype, device=device)
            if block.action_model is not None:
                block.action_model.make_units(device, dtype)
        return self

    def fuse_context_projections(self) -> "CausalWanModel":
        """Compute the cross-attention context's k and v of all layers in one :class:`ContextProjection`
        (graphs' form). The layers' ``cross_attn.k``, ``.v`` and ``.norm_k`` move into it: their state
        dict keys leave the model (graphs never load a checkpoint into a prepared model), and each layer's
        ``norm_q`` weight takes ``norm_k``'s in (see :class:`ContextProjection`)."""
        if self.context_projection is None:
            layers = [block.cross_attn for block in self.blocks]
            self.context_projection = ContextProjection(layers)
            for attn in layers:
                del attn.k, attn.v, attn.norm_k
        return self

    def stack_modulations(self) -> "CausalWanModel":
        """Compute every layer's fused-norm operands of a pass in one :class:`ModulationTable` (graphs' form
        with the fused ops; the layers keep their ``modulation`` for the PyTorch ops' path). Once."""
        if self.modulation_table is None:
            self.modulation_table = ModulationTable(self.blocks)
        return self

    def fuse_keyboard_projections(self) -> "CausalWanModel":
        """Compute the keyboard keys and values of all action layers in one :class:`KeyboardProjection`
        (graphs' form). The layers' ``keyboard_embed``, ``keyboard_attn_kv`` and ``key_attn_k_norm`` move
        into it, as :meth:`fuse_context_projections` moves the context's."""
        modules = self._action_modules("enable_keyboard")
        if self.keyboard_projection is None and modules:
            self.keyboard_projection = KeyboardProjection(modules)
            for m in modules.values():
                del m.keyboard_embed, m.keyboard_attn_kv, m.key_attn_k_norm
        return self

    def split_mouse_inputs(self) -> "CausalWanModel":
        """Split every mouse layer's first MLP linear at its input's concatenation (graphs' form,
        :class:`MouseWindowProjection`): the layers keep the token columns, the window's columns and the
        bias move into the projection (their state dict shapes change)."""
        modules, tokens_dim = self._action_modules("enable_mouse"), self.cfg.model.action_config.img_hidden_size
        if self.mouse_projection is None and modules:
            self.mouse_projection = MouseWindowProjection(modules, tokens_dim)
            for m in modules.values():
                m.mouse_mlp[0] = MouseWindowProjection.tokens_only(m.mouse_mlp[0], tokens_dim)
        return self

    def _action_modules(self, enabled: str) -> dict[int, ActionModule]:
        """The action layers' modules with ``enabled`` (enable_mouse / enable_keyboard) set."""
        return {b.layer: b.action_model for b in self.blocks
                if b.action_model is not None and getattr(b.action_model, enabled)}

    def use_fp8(self) -> "CausalWanModel":
        """Run the layers' FP8 linears (:data:`wan_trt.model.fp8.FP8_LINEARS`) as FP8 GEMMs."""
        return use_fp8(self)

    @property
    def residual_dtype(self) -> torch.dtype:
        return torch.float32 if self.dtype == torch.float16 else self.dtype

    def encode_context(self, visual_context: torch.Tensor) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """CLIP features [B, 257, 1280] -> per-layer cross-attention (k, v), constant per stream."""
        context = self.img_emb(visual_context.to(self.dtype))
        if self.context_projection is not None:
            return self.context_projection(context)
        return [block.cross_attn.context_kv(context) for block in self.blocks]

    def encode_keyboard(self, keyboard_window: torch.Tensor | None, rope_action) -> dict[int, KeyboardKV]:
        """The block's keyboard window -> each action layer's keyboard (k, v); empty without a keyboard."""
        if keyboard_window is None:
            return {}
        if self.keyboard_projection is not None:
            return self.keyboard_projection(keyboard_window, *rope_action)
        modules = self._action_modules("enable_keyboard")
        return {layer: m.keyboard_kv(keyboard_window, *rope_action) for layer, m in modules.items()}

    def encode_mouse(self, mouse_window: torch.Tensor | None) -> dict[int, torch.Tensor | MouseShare]:
        """The block's mouse window -> each mouse layer's input: the window itself, or in the graphs' form
        its :class:`MouseShare`; empty without a mouse."""
        if mouse_window is None:
            return {}
        if self.mouse_projection is not None:
            return self.mouse_projection(mouse_window)
        return {layer: mouse_window for layer in self._action_modules("enable_mouse")}

    def forward(self, latents: torch.Tensor, timestep: torch.Tensor, cond_concat: torch.Tensor,
                context_kv: ContextKV, mouse_window: torch.Tensor | None, keyboard_window: torch.Tensor | None,
                rope: BlockRope, caches) -> torch.Tensor:
        """One pass over one block; returns the flow prediction [B, out_dim, F, H, W] in the model dtype.

        Args:
            latents: noisy latents x_t [B, out_dim, F, H, W].
            timestep: [B, F] float timesteps (908.84... not truncated).
            cond_concat: [B, in_dim - out_dim, F, H, W] mask + image latent of the block.
            context_kv: from :meth:`encode_context`.
            mouse_window, keyboard_window: [B, F, 12, dim_in] raw action windows (None if disabled).
            rope: the block's frame factors (:meth:`BlockRope.at` its absolute start frame).
            caches: :class:`RollingCaches` or :class:`StaticCaches`.
        """
        batch, _, frames, height, width = latents.shape
        x = self.patch_embedding(torch.cat([latents, cond_concat], dim=1).to(self.dtype))
        x = x.flatten(2).transpose(1, 2).contiguous().to(self.residual_dtype)  # [B, F*S, C]
        sinusoid = sinusoidal_embedding_1d(self.cfg.model.freq_dim, timestep.flatten(), self.sinusoid_dtype)
        e = self.time_embedding(sinusoid.to(self.dtype))
        e0 = self.time_projection(e).unflatten(1, (6, -1)).unflatten(0, (batch, frames))  # [B, F, 6, C]
        rope_main = self.rope.main(rope.frame_cos, rope.frame_sin)
        rope_action = None if rope.action_cos is None else self.rope.action(rope.action_cos, rope.action_sin)
        mouse, keyboard_kv = self.encode_mouse(mouse_window), self.encode_keyboard(keyboard_window, rope_action)
        operands = self.modulation_table(e0) if self.modulation_table is not None else [None] * len(self.blocks)
        for block, kv, ops in zip(self.blocks, context_kv, operands):
            x = block(x, e0, kv, rope_main, rope_action, mouse.get(block.layer), keyboard_kv.get(block.layer), caches,
                      ops)
        x = self.head(x, e.unflatten(0, (batch, frames)).unsqueeze(2))
        return self.unpatchify(x, frames, height, width).to(self.dtype)

    def unpatchify(self, x: torch.Tensor, frames: int, height: int, width: int) -> torch.Tensor:
        """[B, F*h*w, pt*ph*pw*c] -> [B, c, F*pt, h*ph, w*pw] (upstream einsum bfhwpqrc->bcfphqwr)."""
        pt, ph, pw = self.cfg.model.patch_size
        c = self.cfg.model.out_dim
        h, w = height // ph, width // pw
        x = x.reshape(x.shape[0], frames, h, w, pt, ph, pw, c)
        x = x.permute(0, 7, 1, 4, 2, 5, 3, 6)
        return x.reshape(x.shape[0], c, frames * pt, h * ph, w * pw)
