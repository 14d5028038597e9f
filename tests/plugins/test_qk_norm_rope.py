import pytest
import torch

from wan_trt.errors import WanTrtError
from wan_trt.plugins.qk_norm_rope import norm_rope, qk_norm_rope, reference_norm_rope, reference_qk_norm_rope
from tests.conftest import assert_close

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
DTYPES = [torch.float32, torch.float16, torch.bfloat16]  # no tl.dot: the interpreter computes bf16 right
TOL = {torch.float32: 1e-5, torch.float16: 2e-3, torch.bfloat16: 2e-2}


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("batch, length, heads, head_dim", [(1, 18, 2, 32), (2, 7, 3, 16), (1, 30, 12, 128),
                                                            (1, 5, 5, 64)])
@pytest.mark.parametrize("per_head", [False, True])
def test_matches_reference(dtype, batch, length, heads, head_dim, per_head):
    gen = torch.Generator().manual_seed(length)
    c = heads * head_dim
    group = head_dim if per_head else c
    q, k = (torch.randn(batch, length, c, generator=gen).to(DEVICE, dtype) for _ in range(2))
    wq, wk = ((1 + 0.1 * torch.randn(c, generator=gen)).to(DEVICE, dtype) for _ in range(2))
    ang = torch.randn(length, head_dim // 2, generator=gen).to(DEVICE) * 10
    out = qk_norm_rope(q, k, wq, wk, ang.cos(), ang.sin(), 1e-6, group)
    ref = reference_qk_norm_rope(q.float(), k.float(), wq.float(), wk.float(), ang.cos(), ang.sin(), 1e-6, group)
    for o, r, name in zip(out, ref, "qk"):
        assert o.dtype == dtype
        assert_close(o, r, atol=TOL[dtype], rtol=TOL[dtype], what=f"{name} {dtype}")


@pytest.mark.parametrize("heads, head_dim, row_group", [(16, 64, 64), (3, 32, 16), (4, 16, 32)])
def test_groups_and_views_of_one_qkv_output(heads, head_dim, row_group):
    """Groups of a head, half a head or two heads; q and k read where they sit in one [.., 3C] output."""
    gen = torch.Generator().manual_seed(heads)
    c, rows, frames = heads * head_dim, 7, 3
    qkv = torch.randn(rows, frames, 3 * c, generator=gen).to(DEVICE) * 4
    q, k = qkv[..., :c], qkv[..., c:2 * c]
    ones = torch.ones(c, device=DEVICE)
    ang = torch.randn(frames, head_dim // 2, generator=gen).to(DEVICE) * 10
    out = qk_norm_rope(q, k, ones, ones, ang.cos(), ang.sin(), 1e-6, row_group)
    ref = reference_qk_norm_rope(q.contiguous(), k.contiguous(), ones, ones, ang.cos(), ang.sin(), 1e-6, row_group)
    for o, r in zip(out, ref):
        assert o.is_contiguous() and o.shape == (rows, frames, c)
        assert_close(o, r, atol=1e-5, rtol=1e-5, what=f"group {row_group}")
    whole = reference_qk_norm_rope(q, k, ones, ones, ang.cos(), ang.sin(), 1e-6, c)[0]
    assert (out[0] - whole).abs().max() > 1e-2  # per-group statistics differ from the row's


def test_matches_the_models_norm_and_rope():
    """Same numbers as WanRMSNorm + apply_rope, the unfused path of the model."""
    from wan_trt.model.layers import WanRMSNorm
    from wan_trt.model.rope import apply_rope
    norm = WanRMSNorm(64, eps=1e-6).to(DEVICE)
    torch.nn.init.normal_(norm.weight, 1.0, 0.1)
    x = torch.randn(1, 9, 64, device=DEVICE)
    ang = torch.randn(9, 16, device=DEVICE)
    unfused = apply_rope(norm(x).unflatten(-1, (2, 32)), ang.cos()[:, None], ang.sin()[:, None]).flatten(-2)
    fused, _ = qk_norm_rope(x, x, norm.weight, norm.weight, ang.cos(), ang.sin(), 1e-6, 64)
    assert_close(fused, unfused, atol=1e-5, what="fused vs model")


def test_matches_the_action_modules_norm_and_rope():
    """Same numbers as ActionRMSNorm (per head, no weight) + apply_rope over frames, the mouse path's."""
    from wan_trt.model.layers import ActionRMSNorm
    from wan_trt.model.rope import apply_rope
    norm = ActionRMSNorm(64, eps=1e-6)
    x = torch.randn(10, 3, 4 * 64, device=DEVICE) * 3  # [tokens, frames, heads * head_dim]
    ang = torch.randn(3, 32, device=DEVICE)
    unfused = apply_rope(norm(x.unflatten(-1, (4, 64))), ang.cos()[:, None], ang.sin()[:, None]).flatten(-2)
    ones = torch.ones(256, device=DEVICE)
    fused, _ = qk_norm_rope(x, x, ones, ones, ang.cos(), ang.sin(), 1e-6, 64)
    assert_close(fused, unfused, atol=1e-5, what="fused vs action module")


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("batch, frames, tokens, heads, head_dim", [(1, 3, 5, 3, 16), (2, 2, 7, 16, 64),
                                                                    (1, 1, 9, 12, 128), (1, 3, 4, 5, 32)])
def test_norm_rope_rotates_each_run_of_rows_by_its_table_row(dtype, batch, frames, tokens, heads, head_dim):
    """One tensor, rows in runs of L / T (the keyboard queries: [frame, token] rows, a rotation per
    frame): the reference, and qk_norm_rope's q with the table row repeated for every row of a run."""
    gen = torch.Generator().manual_seed(tokens)
    c = heads * head_dim
    x = (torch.randn(batch, frames * tokens, c, generator=gen) * 3).to(DEVICE, dtype)
    w = (1 + 0.1 * torch.randn(c, generator=gen)).to(DEVICE, dtype)
    ang = torch.randn(frames, head_dim // 2, generator=gen).to(DEVICE) * 10
    out = norm_rope(x, w, ang.cos(), ang.sin(), 1e-6, head_dim)
    ref = reference_norm_rope(x.float(), w.float(), ang.cos(), ang.sin(), 1e-6, head_dim)
    assert out.dtype == dtype and out.shape == x.shape
    assert_close(out, ref, atol=TOL[dtype], rtol=TOL[dtype], what=f"norm_rope {dtype}")
    per_row = ang.repeat_interleave(tokens, dim=0)
    both, _ = qk_norm_rope(x, x, w, w, per_row.cos(), per_row.sin(), 1e-6, head_dim)
    assert torch.equal(out, both)
    if frames > 1:  # the run's table row, not the row's index, picks the rotation
        assert (out - qk_norm_rope(x, x, w, w, ang.repeat(tokens, 1).cos(), ang.repeat(tokens, 1).sin(), 1e-6,
                                   head_dim)[0]).abs().max() > 1e-2


@pytest.mark.parametrize("batch", [1, 2])
def test_norm_rope_matches_the_keyboard_attentions_queries(batch):
    """Same numbers as the keyboard path's ActionRMSNorm (per head, no weight) + apply_rope of
    [frame, spatial token] rows, a rotation per frame; batches included."""
    from wan_trt.model.layers import ActionRMSNorm
    from wan_trt.model.rope import apply_rope
    frames, tokens, heads, head_dim = 3, 5, 4, 32
    x = torch.randn(batch, frames * tokens, heads * head_dim, device=DEVICE) * 3
    ang = torch.randn(frames, head_dim // 2, device=DEVICE)
    q = ActionRMSNorm(head_dim, eps=1e-6)(x.unflatten(-1, (heads, head_dim))).unflatten(1, (frames, tokens))
    unfused = apply_rope(q, ang.cos()[:, None, None, :], ang.sin()[:, None, None, :]).flatten(1, 2).flatten(-2)
    fused = norm_rope(x, torch.ones(heads * head_dim, device=DEVICE), ang.cos(), ang.sin(), 1e-6, head_dim)
    assert_close(fused, unfused, atol=1e-5, what=f"fused vs keyboard path, batch {batch}")


@pytest.mark.parametrize("dtype", DTYPES)
def test_norm_rope_with_the_identity_rotation_normalises_every_layers_context_k_in_place(dtype):
    """The graphs' context projection: each layer's k rows where they sit in the GEMM's [T, L, (k, v), C] output
    (rows 2C apart), normalised over the whole width with a unit weight and cos 1, sin 0: a plain RMS norm."""
    from wan_trt.model.layers import rms_normalize
    tokens, layers, heads, head_dim = 7, 3, 2, 32
    c = heads * head_dim
    kv = (torch.randn(1, tokens, layers, 2, c, generator=torch.Generator().manual_seed(3)) * 3).to(DEVICE, dtype)
    rows = kv[..., 0, :].flatten(1, 2)  # [1, T * L, C], a view
    assert rows.stride(1) == 2 * c and not rows.is_contiguous()
    cos, sin = torch.ones(1, head_dim // 2, device=DEVICE), torch.zeros(1, head_dim // 2, device=DEVICE)
    out = norm_rope(rows, torch.ones(c, device=DEVICE, dtype=dtype), cos, sin, 1e-6, c)
    assert out.is_contiguous() and out.shape == rows.shape
    assert_close(out, rms_normalize(rows.float(), 1e-6), atol=TOL[dtype], rtol=TOL[dtype], what=f"context k {dtype}")


def test_norm_rope_limits():
    x = torch.randn(1, 6, 64, device=DEVICE)
    w = torch.ones(64, device=DEVICE)
    for rows in (4, 0, 12):  # not dividing the 6 rows
        ang = torch.randn(rows, 16, device=DEVICE)
        with pytest.raises(WanTrtError, match="T dividing the 6 rows"):
            norm_rope(x, w, ang.cos(), ang.sin(), 1e-6, 32)
    ang = torch.randn(3, 16, device=DEVICE)
    with pytest.raises(WanTrtError, match="norm_rope: weights"):
        norm_rope(x, w[:32], ang.cos(), ang.sin(), 1e-6, 32)
    with pytest.raises(WanTrtError, match="norm_rope: group 24"):
        norm_rope(x, w, ang.cos(), ang.sin(), 1e-6, 24)
    with pytest.raises(WanTrtError, match="norm_rope: rows"):
        norm_rope(x.transpose(1, 2).contiguous().transpose(1, 2), w, ang.cos(), ang.sin(), 1e-6, 32)
    from wan_trt.plugins.aot import TensorArg
    from wan_trt.plugins.qk_norm_rope import norm_rope_plan
    table = TensorArg((4, 16), torch.float32)  # the engine's plan: 4 table rows for 6 rows of x
    with pytest.raises(WanTrtError, match="T dividing the 6 rows"):
        norm_rope_plan(TensorArg((1, 6, 64), torch.float32), TensorArg((64,), torch.float32), table, table, 1e-6, 32)


def test_limits():
    x = torch.randn(1, 4, 64, device=DEVICE)
    ang = torch.randn(4, 16, device=DEVICE)
    with pytest.raises(WanTrtError, match="cos/sin"):
        qk_norm_rope(x, x, x[0, 0], x[0, 0], ang.double(), ang.sin(), 1e-6, 64)
    with pytest.raises(WanTrtError, match="weights"):
        qk_norm_rope(x, x, x[0, 0, :10], x[0, 0], ang.cos(), ang.sin(), 1e-6, 64)
    for group in (24, 48, 0, 128):  # not dividing C = 64, none, wider than C
        with pytest.raises(WanTrtError, match="group"):
            qk_norm_rope(x, x, x[0, 0], x[0, 0], ang.cos(), ang.sin(), 1e-6, group)
    wide = torch.randn(1, 4, 96, device=DEVICE)  # 96 channels, heads of 32 (16 pairs)
    for group in (24, 6, 9, 48):  # 12, 3 or 24 pairs (not a power of two), odd
        with pytest.raises(WanTrtError, match="group"):
            qk_norm_rope(wide, wide, wide[0, 0], wide[0, 0], ang.cos(), ang.sin(), 1e-6, group)
    heads_of_24 = torch.randn(4, 12, device=DEVICE)
    with pytest.raises(WanTrtError, match="whole heads of 24"):  # 16 pairs, but 1 1/3 heads
        qk_norm_rope(wide, wide, wide[0, 0], wide[0, 0], heads_of_24.cos(), heads_of_24.sin(), 1e-6, 32)
