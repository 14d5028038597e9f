"""The video decoder's fused norms (``plugins/decoder_norm.py``) at a steady block's shapes, under
different launches: how close each call comes to the GPU's memory bandwidth, and which launch the
kernels should take.

    python3 scripts/decoder_norms.py --out RESULTS/decoder_norms_<device>.json [--config universal]

The calls are those the decoder's engine form makes in one steady block (traced with fake tensors, so
the list follows the model code). Each distinct call is timed (``triton.testing.do_bench_cudagraph``)
under every launch of ``--tiles`` values a tile x ``--warps`` warps (whose rows divide a frame's, as the
kernels need), beside the launch the kernels take today (``plugins.launch.rows_launch``); the bytes each
call must move (read x, r and the history, write the joined input and the sum) over its time give its
bandwidth, and a plain device-to-device copy of as many bytes gives the yardstick. Every launch's output
is compared with today's.
"""
from __future__ import annotations

import argparse
import collections

import torch
import triton
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.utils._python_dispatch import TorchDispatchMode

import wan_trt.plugins.ops  # noqa: F401  (registers torch.ops.wan_trt.*)
from wan_trt.config_load import load_config
from wan_trt.model import build_decoder
from wan_trt.plugins import decoder_norm as dn
from wan_trt.plugins.launch import Launch, next_power_of_two, rows_launch
from wan_trt.profiling import provenance, write_result

KERNELS = {"norm_silu_join": dn._norm_silu_join_kernel, "add_norm_silu_join": dn._add_norm_silu_join_kernel,
           "split_norm_silu_join": dn._split_norm_silu_join_kernel,
           "split_add_norm_silu_join": dn._split_add_norm_silu_join_kernel}


class _Calls(TorchDispatchMode):
    """Records every fused-norm call: (op, input shapes)."""

    def __init__(self):
        super().__init__()
        self.calls = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = func.__name__.split(".")[0]
        if name in KERNELS:
            self.calls.append((name, tuple(tuple(a.shape) for a in args)))
        return func(*args, **(kwargs or {}))


def block_calls(config: str) -> list[tuple[str, tuple]]:
    """The fused-norm calls of one steady block of ``config``'s decoder, in order."""
    cfg = load_config(config)
    decoder = build_decoder(cfg, dtype=torch.bfloat16).use_engine_form(fused=True)
    h, w = cfg.inference.latent_height, cfg.inference.latent_width
    mode = _Calls()
    with FakeTensorMode(allow_non_fake_inputs=True), mode, torch.no_grad():
        decoder(torch.zeros(1, decoder.cfg.z_dim, cfg.inference.num_frame_per_block, h, w, dtype=torch.bfloat16),
                decoder.empty_history(1, h, w), first=False)
    return mode.calls


def _arguments(op: str, shapes: tuple, gen: torch.Generator) -> list[torch.Tensor]:
    out = []
    for shape in shapes:
        t = torch.randn(shape, device="cuda", generator=gen).to(torch.bfloat16)
        out.append(t.contiguous(memory_format=torch.channels_last_3d) if len(shape) == 5 else t)
    return out


def moved_bytes(op: str, shapes: tuple) -> int:
    """Bytes a call must read and write (bf16): x's C channels, r, the history; joined, the sum."""
    b, _, t, h, w = shapes[0]
    c = shapes[-2][0]
    rows = b * h * w * c
    elements = t * rows + dn.HISTORY * rows + (t + dn.HISTORY) * rows
    if "add" in op:
        elements += 2 * t * rows
    return 2 * elements


def _run(op: str, args: list[torch.Tensor], launch: Launch):
    """The kernel of ``op`` on ``args`` under ``launch``: (a function launching it, its outputs)."""
    x, x_tail = args[0], (args[1] if op.startswith("split") else None)
    rest = args[2:] if x_tail is not None else args[1:]
    bias, r = rest[0], (rest[1] if "add" in op else None)
    gamma, history = rest[-2], rest[-1]
    sizes = dn._sizes(op, x.shape, bias.shape, None if r is None else r.shape, gamma.shape, history.shape,
                      None if x_tail is None else x_tail.shape)
    b, _, t, h, w = x.shape
    s = None if r is None else dn._empty(r.shape, r)
    joined = dn._empty((b, sizes["C"], t + dn.HISTORY, h, w), history)
    inputs = [a for a in (x, x_tail, bias, r, gamma, history) if a is not None]
    outputs = [joined] if s is None else [s, joined]
    grid = (triton.cdiv(sizes["ROWS"], launch.blocks["BLOCK_R"]),)

    def fn():
        KERNELS[op][grid](*inputs, *outputs, **sizes, **launch.kwargs())
    return fn, outputs


def launches(c: int, frame_rows: int, tiles: list[int], warps: list[int]) -> list[Launch]:
    """Every launch of ``tiles`` values x ``warps`` whose rows divide a frame's (the kernels' condition)."""
    block = next_power_of_two(c)
    return [Launch({"BLOCK_R": max(1, tile // block), "BLOCK_C": block}, num_warps=nw, num_stages=1)
            for tile in tiles for nw in warps if tile >= block and frame_rows % max(1, tile // block) == 0]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", required=True)
    parser.add_argument("--config", default="universal")
    parser.add_argument("--tiles", default="1024,2048,4096,8192,16384")
    parser.add_argument("--warps", default="1,2,4,8")
    args = parser.parse_args()
    from triton.testing import do_bench_cudagraph
    tiles = [int(v) for v in args.tiles.split(",")]
    warps = [int(v) for v in args.warps.split(",")]
    calls = block_calls(args.config)
    counts = collections.Counter(calls)
    gen = torch.Generator(device="cuda").manual_seed(0)
    rows, block_now, block_best = [], 0.0, 0.0
    for (op, shapes), n in counts.items():
        tensors = _arguments(op, shapes, gen)
        nbytes = moved_bytes(op, shapes)
        frame_rows = shapes[0][3] * shapes[0][4]
        today = rows_launch(shapes[-2][0], frame_rows)
        fn, expected = _run(op, tensors, today)
        fn()
        results = []
        for launch in [today] + [l for l in launches(shapes[-2][0], frame_rows, tiles, warps) if l != today]:
            fn, outputs = _run(op, tensors, launch)
            fn()
            torch.cuda.synchronize()
            same = all(torch.equal(a, b) for a, b in zip(outputs, expected))
            ms = float(do_bench_cudagraph(fn, rep=60))
            results.append({"block_r": launch.blocks["BLOCK_R"], "block_c": launch.blocks["BLOCK_C"],
                            "warps": launch.num_warps, "ms": ms, "tb_per_s": nbytes / ms / 1e9,
                            "same_as_today": same})
        src = torch.empty(nbytes // 4, dtype=torch.bfloat16, device="cuda")
        dst = torch.empty_like(src)
        copy_ms = float(do_bench_cudagraph(lambda: dst.copy_(src), rep=60))
        best = min(results, key=lambda r: r["ms"])
        block_now += n * results[0]["ms"]
        block_best += n * best["ms"]
        row = {"op": op, "shapes": shapes, "calls_per_block": n, "bytes": nbytes, "today": results[0],
               "best": best, "copy_ms": copy_ms, "copy_tb_per_s": nbytes / copy_ms / 1e9, "launches": results}
        rows.append(row)
        now = results[0]
        print(f"{op:26s} {str(shapes[0]):24s} x{n}: today {now['ms']:.4f} ms ({now['tb_per_s']:.2f} TB/s, "
              f"R{now['block_r']} w{now['warps']}), best {best['ms']:.4f} ({best['tb_per_s']:.2f}, "
              f"R{best['block_r']} w{best['warps']}, same {best['same_as_today']}), copy {copy_ms:.4f}", flush=True)
    print(f"block: today {block_now:.3f} ms, best launches {block_best:.3f} ms")
    write_result(args.out, {**provenance(device="cuda"), "config": args.config, "calls": len(calls),
                            "block_ms_today": block_now,
                            "block_ms_best": block_best, "rows": rows})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
