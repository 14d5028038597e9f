"""RoPE against independent transcriptions of upstream's complex128 / interleaved code, inside
upstream's tables and past their ends (the tables simply extended in float64)."""
import pytest
import torch

from wan_trt.config_load import load_config
from wan_trt.model.rope import BlockRope, RopeTables, apply_rope
from wan_trt.rotary import MAX_STREAM_FRAMES, action_frame_frequencies, main_frame_frequencies, rope_split, \
    rotary_factors
from tests.conftest import assert_close


def rope_params(max_len, dim, theta=10000):
    """Upstream rope_params: complex128 polar of float64 angles, ``max_len`` rows (upstream: 1024)."""
    freqs = torch.outer(torch.arange(max_len), 1.0 / torch.pow(theta, torch.arange(0, dim, 2).to(torch.float64).div(dim)))
    return torch.polar(torch.ones_like(freqs), freqs)


def upstream_causal_rope(x, f, h, w, start_frame, head_dim):
    """Upstream causal_rope_apply over a frame table extended to cover ``start_frame + f`` (1024 upstream)."""
    d, rows = head_dim, max(1024, start_frame + f)
    freqs = torch.cat([rope_params(rows, d - 4 * (d // 6)), rope_params(rows, 2 * (d // 6)),
                       rope_params(rows, 2 * (d // 6))], dim=1)
    c = d // 2
    parts = freqs.split([c - 2 * (c // 3), c // 3, c // 3], dim=1)
    n = x.shape[2]
    xi = torch.view_as_complex(x[0].to(torch.float64).reshape(f * h * w, n, -1, 2))
    fi = torch.cat([parts[0][start_frame:start_frame + f].view(f, 1, 1, -1).expand(f, h, w, -1),
                    parts[1][:h].view(1, h, 1, -1).expand(f, h, w, -1),
                    parts[2][:w].view(1, 1, w, -1).expand(f, h, w, -1)], dim=-1).reshape(f * h * w, 1, -1)
    return torch.view_as_real(xi * fi).flatten(2)[None]


def upstream_action_tables(a, frames):
    """Upstream get_1d_rotary_pos_embed(use_real=True) over a [frames, 1, 1] grid (7500 upstream), in fp32."""
    cos_parts, sin_parts = [], []
    for i, dim in enumerate(a.mouse_qk_dim_list):
        pos = torch.arange(frames).float() if i == 0 else torch.zeros(frames)
        freqs = 1.0 / (a.rope_theta ** (torch.arange(0, dim, 2)[: dim // 2].float() / dim))
        ang = torch.outer(pos, freqs)
        cos_parts.append(ang.cos().repeat_interleave(2, dim=1))
        sin_parts.append(ang.sin().repeat_interleave(2, dim=1))
    return torch.cat(cos_parts, 1), torch.cat(sin_parts, 1)


def test_split():
    assert rope_split(128) == (22, 21, 21) and rope_split(32) == (6, 5, 5)


@pytest.mark.parametrize("name,start", [("universal", 0), ("universal", 1017), ("universal-small", 6),
                                        ("universal", 1020), ("universal", 7800), ("universal-small", 20_001)])
def test_main_rope_matches_upstream_complex128(name, start):
    """Inside upstream's 1024-frame table (1020: its last block) and past its end."""
    cfg = load_config(name)
    h, w = cfg.grid_hw
    x = torch.randn(1, 3 * h * w, 2, cfg.head_dim)
    rope = BlockRope.at(cfg, start)
    cos, sin = RopeTables(cfg).main(rope.frame_cos, rope.frame_sin)
    ours = apply_rope(x, cos[:, None, :], sin[:, None, :])
    assert_close(ours, upstream_causal_rope(x, 3, h, w, start, cfg.head_dim), atol=2e-5, what=f"{name}@{start}")


def test_frame_factors_equal_upstreams_float64_table_bit_for_bit():
    """Where upstream's table reaches, the fed factors are its entries rounded to fp32, all 1024 rows."""
    inside = rope_params(1024, 44)
    cos, sin = rotary_factors(main_frame_frequencies(128), 0, 1024)
    assert torch.equal(cos, inside.real.float()) and torch.equal(sin, inside.imag.float())
    extended = rope_params(8000, 44)[7797:]
    cos, sin = rotary_factors(main_frame_frequencies(128), 7797, 203)
    assert torch.equal(cos, extended.real.float()) and torch.equal(sin, extended.imag.float())


def test_action_factors_are_upstreams_fp32_table_within_one_ulp():
    """Upstream forms cos/sin of the action angles in fp32; the same angles (powers-of-two frequencies)
    in float64 round to the same fp32 value or its neighbour: at most 6e-8 apart over all 7500 rows."""
    a = load_config("universal").model.action_config
    cos, sin = upstream_action_tables(a, 7500)
    ours = rotary_factors(action_frame_frequencies(a.mouse_qk_dim_list[0], float(a.rope_theta)), 0, 7500)
    pairs = a.mouse_qk_dim_list[0] // 2
    for got, want in zip(ours, (cos[:, :2 * pairs:2], sin[:, :2 * pairs:2])):
        assert (got - want).abs().max() <= 2 ** -24


@pytest.mark.parametrize("start", [40, 7497, 7500, 9000])
def test_action_rope_matches_upstream_rotate_half(start):
    """Inside upstream's 7500-frame table, at its end and past it (the table extended)."""
    cfg = load_config("universal")
    a = cfg.model.action_config
    cos, sin = upstream_action_tables(a, max(7500, start + 3))
    x = torch.randn(5, 3, 16, 64)
    real, imag = x.reshape(*x.shape[:-1], -1, 2).unbind(-1)
    rot = torch.stack([-imag, real], dim=-1).flatten(3)
    expected = x * cos[None, start:start + 3, None] + rot * sin[None, start:start + 3, None]
    rope = BlockRope.at(cfg, start)
    c, s = RopeTables(cfg).action(rope.action_cos, rope.action_sin)
    assert_close(apply_rope(x, c[:, None, :], s[:, None, :]), expected, atol=1e-5, what=f"action rope @{start}")


def test_rotation_error_does_not_grow_with_the_position():
    """Scores depend on position differences only: q at frame p against k at p - 2 gives the same
    score at every p (within fp32 rounding), up to the last frame a stream can reach."""
    cfg = load_config("universal-small")
    freqs = main_frame_frequencies(cfg.head_dim)
    q, k = torch.randn(2, len(freqs) * 2, dtype=torch.float64).unbind(0)

    def score(p: int) -> float:
        cos, sin = rotary_factors(freqs, p - 2, 3)
        rq = apply_rope(q.float()[None], cos[2:], sin[2:])
        rk = apply_rope(k.float()[None], cos[:1], sin[:1])
        return float((rq.double() * rk.double()).sum())

    base = score(2)
    errors = [abs(score(p) - base) for p in (1_000, 7_500, 10 ** 6, MAX_STREAM_FRAMES - 1)]
    assert max(errors) < 2e-5 * (q.norm() * k.norm()).item(), errors


def test_tables_stay_fp32_under_to_dtype():
    tables = RopeTables(load_config("universal-small")).to(torch.bfloat16)
    assert all(b.dtype == torch.float32 for b in tables.buffers())
