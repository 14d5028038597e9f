"""RoPE tables against independent transcriptions of upstream's complex128 / interleaved code."""
import torch

from wan_trt.config_load import load_config
from wan_trt.model.rope import RopeTables, apply_rope, rope_split
from tests.conftest import assert_close


def upstream_causal_rope(x, f, h, w, start_frame, head_dim):
    """Upstream causal_rope_apply: complex128 freqs (rope_params) over (frame, height, width)."""
    def rope_params(max_len, dim, theta=10000):
        freqs = torch.outer(torch.arange(max_len), 1.0 / torch.pow(theta, torch.arange(0, dim, 2).to(torch.float64).div(dim)))
        return torch.polar(torch.ones_like(freqs), freqs)
    d = head_dim
    freqs = torch.cat([rope_params(1024, d - 4 * (d // 6)), rope_params(1024, 2 * (d // 6)),
                       rope_params(1024, 2 * (d // 6))], dim=1)
    c = d // 2
    parts = freqs.split([c - 2 * (c // 3), c // 3, c // 3], dim=1)
    n = x.shape[2]
    xi = torch.view_as_complex(x[0].to(torch.float64).reshape(f * h * w, n, -1, 2))
    fi = torch.cat([parts[0][start_frame:start_frame + f].view(f, 1, 1, -1).expand(f, h, w, -1),
                    parts[1][:h].view(1, h, 1, -1).expand(f, h, w, -1),
                    parts[2][:w].view(1, 1, w, -1).expand(f, h, w, -1)], dim=-1).reshape(f * h * w, 1, -1)
    return torch.view_as_real(xi * fi).flatten(2)[None]


def test_split():
    assert rope_split(128) == (22, 21, 21) and rope_split(32) == (6, 5, 5)


def test_main_rope_matches_upstream_complex128():
    for name, start in (("universal", 0), ("universal", 1017), ("universal-small", 6)):
        cfg = load_config(name)
        tables = RopeTables(cfg)
        h, w = cfg.grid_hw
        x = torch.randn(1, 3 * h * w, 2, cfg.head_dim)
        cos, sin = tables.main(torch.tensor([start], dtype=torch.int32), 3)
        ours = apply_rope(x, cos[:, None, :], sin[:, None, :])
        assert_close(ours, upstream_causal_rope(x, 3, h, w, start, cfg.head_dim), atol=2e-5, what=f"{name}@{start}")


def test_action_rope_matches_upstream_rotate_half():
    cfg = load_config("universal")
    a = cfg.model.action_config
    tables = RopeTables(cfg)
    # upstream get_1d_rotary_pos_embed(use_real=True) over a [7500, 1, 1] grid, then apply_rotary_emb
    dims = a.mouse_qk_dim_list
    cos_parts, sin_parts = [], []
    for i, dim in enumerate(dims):
        pos = torch.arange(7500).float() if i == 0 else torch.zeros(7500)
        freqs = 1.0 / (a.rope_theta ** (torch.arange(0, dim, 2)[: dim // 2].float() / dim))
        ang = torch.outer(pos, freqs)
        cos_parts.append(ang.cos().repeat_interleave(2, dim=1))
        sin_parts.append(ang.sin().repeat_interleave(2, dim=1))
    cos, sin = torch.cat(cos_parts, 1), torch.cat(sin_parts, 1)
    x = torch.randn(5, 3, 16, 64)
    start = 40
    real, imag = x.reshape(*x.shape[:-1], -1, 2).unbind(-1)
    rot = torch.stack([-imag, real], dim=-1).flatten(3)
    expected = x * cos[None, start:start + 3, None] + rot * sin[None, start:start + 3, None]
    c, s = tables.action(start, 3)
    assert_close(apply_rope(x, c[:, None, :], s[:, None, :]), expected, atol=1e-5, what="action rope")


def test_tables_stay_fp32_under_to_dtype():
    tables = RopeTables(load_config("universal-small")).to(torch.bfloat16)
    assert all(b.dtype == torch.float32 for b in tables.buffers())
