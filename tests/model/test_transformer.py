import copy
import dataclasses
import re

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from wan_trt.config_load import load_config
from wan_trt.graphs import GRAPH_KINDS
from wan_trt.model import CausalWanModel, build_model
from wan_trt.model.rope import BlockRope
from wan_trt.model.static_pass import StaticPass
from wan_trt.spec import KEYBOARD_WINDOW, PassSpec


def upstream_state_dict_shapes(kb_dim, mouse):
    """Keys and shapes of upstream's full-size CausalWanModel, transcribed from Matrix-Game-2's
    wan/modules/causal_model.py, model.py and action_module.py (independent of wan-trt's config code)."""
    d, ffn, L = 1536, 8960, 30
    s = {"patch_embedding.weight": (d, 36, 1, 2, 2), "patch_embedding.bias": (d,),
         "time_embedding.0.weight": (d, 256), "time_embedding.0.bias": (d,),
         "time_embedding.2.weight": (d, d), "time_embedding.2.bias": (d,),
         "time_projection.1.weight": (6 * d, d), "time_projection.1.bias": (6 * d,),
         "head.modulation": (1, 2, d), "head.head.weight": (64, d), "head.head.bias": (64,),
         "img_emb.proj.0.weight": (1280,), "img_emb.proj.0.bias": (1280,),
         "img_emb.proj.1.weight": (1280, 1280), "img_emb.proj.1.bias": (1280,),
         "img_emb.proj.3.weight": (d, 1280), "img_emb.proj.3.bias": (d,),
         "img_emb.proj.4.weight": (d,), "img_emb.proj.4.bias": (d,)}
    for i in range(L):
        p = f"blocks.{i}."
        s[p + "modulation"] = (1, 6, d)
        for attn in ("self_attn", "cross_attn"):
            for lin in "qkvo":
                s[f"{p}{attn}.{lin}.weight"], s[f"{p}{attn}.{lin}.bias"] = (d, d), (d,)
            s[f"{p}{attn}.norm_q.weight"] = s[f"{p}{attn}.norm_k.weight"] = (d,)
        s[p + "norm3.weight"] = s[p + "norm3.bias"] = (d,)
        s[p + "ffn.0.weight"], s[p + "ffn.0.bias"] = (ffn, d), (ffn,)
        s[p + "ffn.2.weight"], s[p + "ffn.2.bias"] = (d, ffn), (d,)
        if i < 15:
            a = p + "action_model."
            s[a + "keyboard_embed.0.weight"], s[a + "keyboard_embed.0.bias"] = (128, kb_dim), (128,)
            s[a + "keyboard_embed.2.weight"], s[a + "keyboard_embed.2.bias"] = (128, 128), (128,)
            if mouse:
                s[a + "mouse_mlp.0.weight"], s[a + "mouse_mlp.0.bias"] = (1024, 2 * 12 + d), (1024,)
                s[a + "mouse_mlp.2.weight"], s[a + "mouse_mlp.2.bias"] = (1024, 1024), (1024,)
                s[a + "mouse_mlp.3.weight"] = s[a + "mouse_mlp.3.bias"] = (1024,)
                s[a + "t_qkv.weight"] = (3072, 1024)
                s[a + "img_attn_q_norm.weight"] = s[a + "img_attn_k_norm.weight"] = (64,)
                s[a + "proj_mouse.weight"] = (d, 1024)
            s[a + "key_attn_q_norm.weight"] = s[a + "key_attn_k_norm.weight"] = (64,)
            s[a + "mouse_attn_q.weight"] = (1024, d)
            s[a + "keyboard_attn_kv.weight"] = (2048, 128 * 12)
            s[a + "proj_keyboard.weight"] = (d, 1024)
    return s


@pytest.mark.parametrize("name, kb_dim, mouse", [("universal", 4, True), ("gta_drive", 2, True),
                                                 ("templerun", 7, False)])
def test_state_dict_equals_upstream(name, kb_dim, mouse):
    with torch.device("meta"):
        model = CausalWanModel(load_config(name))
    ours = {k: tuple(v.shape) for k, v in model.state_dict().items()}
    expected = upstream_state_dict_shapes(kb_dim, mouse)
    assert sorted(set(ours) - set(expected)) == [] and sorted(set(expected) - set(ours)) == []
    assert {k: v for k, v in ours.items() if expected[k] != v} == {}


def test_random_init_redraws_what_upstream_zeroes(small_cfg):
    model = build_model(small_cfg, seed=3)
    assert model.head.head.weight.abs().min() > 0
    for layer in small_cfg.action_layers:
        am = model.blocks[layer].action_model
        for proj in ("proj_mouse", "proj_keyboard"):
            if hasattr(am, proj):
                assert getattr(am, proj).weight.abs().sum() > 0
    again = build_model(small_cfg, seed=3)
    assert all(torch.equal(a, b) for a, b in zip(model.parameters(), again.parameters()))


def test_bf16_model_keeps_fp32_rope(small_cfg):
    model = build_model(small_cfg, torch.bfloat16)
    assert model.dtype == torch.bfloat16
    assert model.rope.hw_cos.dtype == torch.float32


class _GemmCount(TorchDispatchMode):
    """Counts the matrix products a call runs (nn.Linear dispatches to addmm / mm), with their inner
    dims, and the shapes its concatenations make."""

    GEMMS = (torch.ops.aten.addmm.default, torch.ops.aten.mm.default, torch.ops.aten.bmm.default,
             torch.ops.aten.baddbmm.default)

    def __init__(self):
        super().__init__()
        self.count = 0
        self.inner_dims: list[int] = []
        self.concatenated: list[tuple[int, ...]] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if func in self.GEMMS:
            self.count += 1
            self.inner_dims.append(args[-1].shape[-2])  # the second factor's rows
        elif func is torch.ops.aten.cat.default:
            self.concatenated.append(tuple(out.shape))
        return out


@torch.no_grad()
@pytest.mark.parametrize("ops", ["native", "plugins"])
def test_graph_form_projects_every_layers_context_in_one_gemm(small_cfg, ops):
    """Graphs hold the cross-attention context's k and v of all layers as one GEMM and one norm (with the
    fused ops one norm_rope kernel for all layers), k's norm weight moved into the query's: every layer's
    cross-attention gives the reference's output, and the layers' k, v, norm_k are gone from the module."""
    model = build_model(small_cfg, seed=2)
    graph_form = GRAPH_KINDS["pass"].prepare(build_model(small_cfg, seed=2), ops, "fp32")
    m = small_cfg.model
    gen = torch.Generator().manual_seed(0)
    visual = torch.randn(1, m.clip_tokens, m.clip_dim, generator=gen)
    x = torch.randn(1, 7, m.dim, generator=gen)
    with _GemmCount() as layers:
        expected = model.encode_context(visual)
    with _GemmCount() as fused, _OpCount() as norms:
        actual = graph_form.encode_context(visual)
    assert (layers.count, fused.count) == (2 + 2 * m.num_layers, 2 + 1)  # img_emb's two linears, then k and v
    assert norms.count == (1 if ops == "plugins" else 0)  # one norm_rope for every layer's k
    assert len(actual) == len(expected) == m.num_layers
    projection = graph_form.context_projection
    assert projection.eps == model.blocks[0].cross_attn.norm_k.eps
    for block, reference, (k, v), (k_ref, v_ref) in zip(graph_form.blocks, model.blocks, actual, expected):
        assert k.shape == k_ref.shape == v.shape == (1, m.clip_tokens, m.num_heads, m.dim // m.num_heads)
        torch.testing.assert_close(v, v_ref, atol=1e-6, rtol=1e-6)
        torch.testing.assert_close(k * reference.cross_attn.norm_k.weight.unflatten(0, k.shape[2:]), k_ref,
                                   atol=1e-6, rtol=1e-5)  # k leaves unweighted: its weight is the query's
        torch.testing.assert_close(block.cross_attn.norm_q.weight,
                                   reference.cross_attn.norm_q.weight * reference.cross_attn.norm_k.weight)
        torch.testing.assert_close(block.cross_attn(x, (k, v)), reference.cross_attn(x, (k_ref, v_ref)),
                                   atol=1e-5, rtol=1e-5)
    moved = [key for key in graph_form.state_dict() if re.search(r"\.cross_attn\.(k|v|norm_k)\.", key)]
    assert moved == [] and any(".self_attn.norm_k." in key for key in graph_form.state_dict())
    graph_form.fuse_context_projections()  # fusing twice changes nothing (the query weights fold once)
    assert graph_form.context_projection is projection
    torch.testing.assert_close(graph_form.blocks[0].cross_attn.norm_q.weight,
                               model.blocks[0].cross_attn.norm_q.weight * model.blocks[0].cross_attn.norm_k.weight)


class _OpCount(TorchDispatchMode):
    """Counts the fused norm_rope op's calls."""

    def __init__(self):
        super().__init__()
        self.count = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.count += func.name() == "wan_trt::norm_rope"
        return func(*args, **(kwargs or {}))


def _action_rope(model: CausalWanModel, spec: PassSpec, feeds: dict[str, torch.Tensor]):
    """The action layers' RoPE (cos, sin) of the block ``feeds`` hold, as the model's forward forms it."""
    rope = BlockRope.of({r.kind: (feeds[r.cos], feeds[r.sin]) for r in spec.rotaries})
    return model.rope.action(rope.action_cos, rope.action_sin)


@torch.no_grad()
def test_graph_form_projects_every_layers_keyboard_at_once(small_cfg):
    """Graphs compute the keyboard keys and values of all action layers in three GEMMs: the same
    per-layer (k, v) as the layers' own modules, and the same pass outputs as the reference model."""
    model = build_model(small_cfg, seed=2)
    graph_form = GRAPH_KINDS["pass"].prepare(build_model(small_cfg, seed=2), "native", "fp32")
    spec = PassSpec.from_config(small_cfg, "fp32")
    feeds = spec.sample_inputs(seed=1)
    rope_action = _action_rope(model, spec, feeds)
    with _GemmCount() as layers:
        expected = model.encode_keyboard(feeds[KEYBOARD_WINDOW], rope_action)
    with _GemmCount() as fused:
        actual = graph_form.encode_keyboard(feeds[KEYBOARD_WINDOW], rope_action)
    keyboard_layers = [b.layer for b in model.blocks if b.action_model is not None and b.action_model.enable_keyboard]
    assert sorted(actual) == sorted(expected) == keyboard_layers != []
    assert (layers.count, fused.count) == (3 * len(keyboard_layers), 3)
    for layer in keyboard_layers:
        for got, ref in zip(actual[layer], expected[layer]):
            assert got.shape == ref.shape and got.is_contiguous()
            torch.testing.assert_close(got, ref, atol=1e-5, rtol=1e-5)
    moved_keys = r"\.(keyboard_embed|keyboard_attn_kv|key_attn_k_norm)\."
    moved = [key for key in graph_form.state_dict() if re.search(moved_keys, key)]
    assert moved == [] and any(".key_attn_q_norm." in key for key in graph_form.state_dict())
    projection = graph_form.keyboard_projection
    assert graph_form.fuse_keyboard_projections().keyboard_projection is projection  # fusing twice changes nothing
    reference, graph = StaticPass(model, spec).run(feeds), StaticPass(graph_form, spec).run(feeds)
    for name in spec.output_names:
        torch.testing.assert_close(graph[name], reference[name], atol=2e-5, rtol=1e-5)


@torch.no_grad()
def test_graph_form_splits_the_mouse_mlps_input(small_cfg):
    """Graphs add the mouse window's share of each layer's first MLP linear per frame (one GEMM for all
    layers) instead of concatenating the window's features to every token: no token-sized concatenation,
    the layers' first GEMMs run over the model width, and the pass equals the reference."""
    model = build_model(small_cfg, seed=3)
    graph_form = GRAPH_KINDS["pass"].prepare(build_model(small_cfg, seed=3), "native", "fp32")
    spec = PassSpec.from_config(small_cfg, "fp32")
    feeds = spec.sample_inputs(seed=4)
    a = small_cfg.model.action_config
    mouse_layers = [b.layer for b in model.blocks if b.action_model is not None and b.action_model.enable_mouse]
    if not mouse_layers:  # nothing to split
        assert graph_form.mouse_projection is None
        return
    joined = a.img_hidden_size + a.mouse_dim_in * a.window_frames  # the reference's first linear's inner dim
    with _GemmCount() as reference_ops:
        reference = StaticPass(model, spec).run(feeds)
    with _GemmCount() as graph_ops:
        graph = StaticPass(graph_form, spec).run(feeds)
    assert reference_ops.inner_dims.count(joined) == len(mouse_layers)
    assert sum(shape[-1] == joined for shape in reference_ops.concatenated) == len(mouse_layers)
    assert joined not in graph_ops.inner_dims and all(shape[-1] != joined for shape in graph_ops.concatenated)
    assert graph_ops.inner_dims.count(a.mouse_dim_in * a.window_frames) == 1  # every layer's share at once
    for block in graph_form.blocks:
        if block.layer in mouse_layers:
            assert block.action_model.mouse_mlp[0].weight.shape == (a.mouse_hidden_dim, a.img_hidden_size)
            assert block.action_model.mouse_mlp[0].bias is None
    for name in spec.output_names:
        torch.testing.assert_close(graph[name], reference[name], atol=2e-5, rtol=1e-5)


@torch.no_grad()
def test_keyboard_projection_adds_a_bias_inside_its_gemm():
    """With biased keyboard k/v linears (``qkv_bias``) in bf16, the projection's k/v equal the layers' bit for bit:
    the bias is added inside the batched GEMM, rounded once, as nn.Linear does (a separate add rounds twice)."""
    cfg = load_config("gta_drive-small")
    action = dataclasses.replace(cfg.model.action_config, qkv_bias=True)
    cfg = dataclasses.replace(cfg, model=dataclasses.replace(cfg.model, action_config=action))
    model = build_model(cfg, torch.bfloat16, seed=2)
    gen = torch.Generator().manual_seed(5)
    for module in model._action_modules("enable_keyboard").values():
        module.keyboard_attn_kv.bias.copy_(torch.randn(module.keyboard_attn_kv.bias.shape, generator=gen))
    graph_form = copy.deepcopy(model).fuse_keyboard_projections()
    spec = PassSpec.from_config(cfg, "bf16")
    feeds = spec.sample_inputs(seed=1)
    rope_action = _action_rope(model, spec, feeds)
    window = feeds[KEYBOARD_WINDOW].to(torch.bfloat16)
    expected, actual = model.encode_keyboard(window, rope_action), graph_form.encode_keyboard(window, rope_action)
    assert sorted(actual) == sorted(expected) != []
    for layer in expected:
        for got, ref in zip(actual[layer], expected[layer]):
            assert torch.equal(got, ref), (layer, (got.float() - ref.float()).abs().max())


@torch.no_grad()
def test_folding_the_context_norm_writes_no_checkpoint_tensor_in_place(tmp_path, small_cfg):
    """A loaded checkpoint's tensors are the model's own: with two layers' query-norm weights tied in the file,
    folding in place multiplied the shared tensor twice and both layers' cross-attention came out 5 % off."""
    from wan_trt.model.checkpoint import read_state_dict
    state = {f"model.{k}": v.clone() for k, v in build_model(small_cfg, seed=2).state_dict().items()}
    state["model.blocks.1.cross_attn.norm_q.weight"] = state["model.blocks.0.cross_attn.norm_q.weight"]  # tied
    torch.save(state, tmp_path / "tied.pt")
    assert len(read_state_dict(tmp_path / "tied.pt")) == len(state)
    reference = build_model(small_cfg, weights=tmp_path / "tied.pt")
    graph_form = GRAPH_KINDS["pass"].prepare(build_model(small_cfg, weights=tmp_path / "tied.pt"), "native", "fp32")
    gen = torch.Generator().manual_seed(0)
    visual = torch.randn(1, small_cfg.model.clip_tokens, small_cfg.model.clip_dim, generator=gen)
    x = torch.randn(1, 7, small_cfg.model.dim, generator=gen)
    for block, ref_block, kv, ref_kv in zip(graph_form.blocks, reference.blocks, graph_form.encode_context(visual),
                                            reference.encode_context(visual)):
        torch.testing.assert_close(block.cross_attn(x, kv), ref_block.cross_attn(x, ref_kv), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_graph_form_with_fused_ops_takes_every_layers_norm_operands_from_one_table(small_cfg, dtype):
    """With the fused ops, graphs compute every layer's shift, 1 + scale and gate of a pass in one table: each
    layer's operands are those it computes alone, and a pass gives the same outputs bit for bit."""
    from wan_trt.engines.backends.torch import TorchRunner
    from wan_trt.model.transformer import AdalnOperands
    spec = PassSpec.from_config(small_cfg, "bf16" if dtype == torch.bfloat16 else "fp32")
    tabled = GRAPH_KINDS["pass"].prepare(build_model(small_cfg, dtype, seed=4), "plugins", spec.precision)
    alone = GRAPH_KINDS["pass"].prepare(build_model(small_cfg, dtype, seed=4), "plugins", spec.precision)
    alone.modulation_table = None
    assert tabled.modulation_table is not None
    e0 = torch.randn(1, small_cfg.block_frames, 6, small_cfg.model.dim, generator=torch.Generator().manual_seed(1))
    for block, operands in zip(tabled.blocks, tabled.modulation_table(e0.to(dtype))):
        expected = AdalnOperands.of(block.modulation.unsqueeze(1) + e0.to(dtype))
        assert len(operands) == 6 and all(torch.equal(a, b) for a, b in zip(operands, expected))
    feeds = spec.sample_inputs(seed=5)
    a, b = TorchRunner(tabled, spec).infer(feeds), TorchRunner(alone, spec).infer(feeds)
    assert all(torch.equal(a[k], b[k]) for k in a)
