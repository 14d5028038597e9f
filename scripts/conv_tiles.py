#!/usr/bin/env python3
"""The video decoder's 3-D convolutions, one by one: cuDNN as the decoder engine runs them beside CUTLASS
implicit-GEMM kernels (scripts/conv_tiles.cu) whose tiles fit the output channels.

cuDNN tiles a convolution's output channels by 64 or 128, so the engine computes the full resolution's
96 outputs as 128 (zero filters) and the quarter resolution's 192 as 128 + 64 (docs/DESIGN.md section 2);
Hopper's wgmma takes any multiple of 8 up to 256. Whether a 96- or 192-wide tile beats cuDNN's kernels
decides whether the engine should carry such kernels: this measures it before any of it is built in.

    python scripts/conv_tiles.py build [--cache out/conv_tiles]              # compile (nvcc, sm_90a; no GPU)
    python scripts/conv_tiles.py bench --out RESULT.json [--config universal] # time them (H100/H200)

`build` compiles one kernel per tile of TILES with CUTLASS's headers (`pip install nvidia-cutlass`) into one
library, cached under --cache by the hash of the source, the tiles, the headers' version and nvcc's, so
a library built on a CPU machine can travel to the GPU machine. `bench` builds it if missing, then for
each distinct causal convolution of a steady decoder block (the block's 3 latent frames, the config's
latent size; bf16): the engine form's cuDNN call (CausalConv3d.forward_joined on a joined channels-last
input, cuDNN benchmark mode, padded or split as the fused engine runs it) timed before and after every
CUTLASS tile on the same tensors, each tile's output against an fp32 convolution (relative L2), and
per block (calls x time): cuDNN's total, the best correct tile's total and the difference. Times are
device times per call (CUDA events around a run of calls, median of several runs).
"""
from __future__ import annotations

import argparse
import concurrent.futures
import ctypes
import hashlib
import importlib.metadata
import json
import os
import shutil
import statistics
import subprocess
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

from wan_trt.config_load import load_config
from wan_trt.errors import WanTrtError
from wan_trt.model import decoder_config
from wan_trt.model.vae import TAPS_BELOW, CausalConv3d, ConvolutionCall, VideoDecoder
from wan_trt.profiling import provenance

SOURCE = Path(__file__).with_name("conv_tiles.cu")
TILES = (  # (M pixels, N output channels, K input channels per step)
    (128, 96, 32), (128, 96, 64), (64, 96, 64),       # the full resolution's 96 outputs
    (128, 192, 64), (64, 192, 64), (128, 192, 32),    # the quarter resolution's 192 (and 384 = 2 x 192)
    (128, 128, 64), (128, 128, 32),                   # cuDNN's own tiles, for a like-for-like comparison
)
CORRECT_REL_L2 = 2e-2  # a tile whose output is further than this from fp32 is wrong, not slow


def tile_name(tile: tuple[int, int, int]) -> str:
    return "conv3d_tile_{}x{}x{}".format(*tile)


def cutlass_include() -> Path:
    try:
        import cutlass_library
    except ImportError:
        raise WanTrtError("CUTLASS's headers are missing: pip install nvidia-cutlass") from None
    include = Path(cutlass_library.__file__).parent / "source" / "include"
    if not (include / "cutlass" / "conv").is_dir():
        raise WanTrtError(f"{include} holds no CUTLASS conv headers: pip install --force-reinstall nvidia-cutlass")
    return include


def nvcc() -> str:
    path = shutil.which("nvcc") or str(Path(os.environ.get("CUDA_HOME", "/usr/local/cuda"), "bin", "nvcc"))
    if not Path(path).is_file():
        raise WanTrtError("nvcc not found: install the CUDA toolkit (12.0+) or set CUDA_HOME")
    return path


def library_path(cache: Path) -> Path:
    """Where the library of TILES lives: keyed by everything that goes into it (the source, the tiles, nvcc's
    version and CUTLASS's), so that one built on another machine is found here."""
    version = subprocess.run([nvcc(), "--version"], capture_output=True, text=True, check=True).stdout
    cutlass_include()  # installed
    key = hashlib.sha256()
    for part in (SOURCE.read_bytes(), repr(TILES).encode(), version.encode(),
                 importlib.metadata.version("nvidia-cutlass").encode()):
        key.update(part)
    return cache / key.hexdigest()[:16] / "libconvtiles.so"


def build(cache: Path) -> Path:
    """Compile every tile (in parallel) and link them into one library; reuse a cached one."""
    lib = library_path(cache)
    if lib.is_file():
        print(f"conv_tiles: cached {lib}")
        return lib
    include = cutlass_include()
    staging = lib.parent.with_name(lib.parent.name + ".partial")
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(parents=True)
    flags = ["-std=c++17", "-O3", "-DNDEBUG", "-gencode=arch=compute_90a,code=sm_90a", "--expt-relaxed-constexpr",
             "-Xcompiler", "-fPIC", f"-I{include}", f"-I{include.parent / 'tools' / 'util' / 'include'}",
             "-DCONV_ELEMENT=cutlass::bfloat16_t"]

    def compile_one(tile: tuple[int, int, int]) -> Path:
        obj = staging / f"{tile_name(tile)}.o"
        macros = [f"-DCONV_NAME={tile_name(tile)}", "-DTILE_M={}".format(tile[0]), "-DTILE_N={}".format(tile[1]),
                  "-DTILE_K={}".format(tile[2])]
        done = subprocess.run([nvcc(), *flags, *macros, "-c", str(SOURCE), "-o", str(obj)],
                              capture_output=True, text=True)
        if done.returncode:
            raise WanTrtError(f"nvcc failed on tile {tile}:\n{done.stderr[-4000:]}")
        print(f"conv_tiles: compiled {tile_name(tile)}", flush=True)
        return obj

    with concurrent.futures.ThreadPoolExecutor(max_workers=os.cpu_count() or 1) as pool:
        objects = list(pool.map(compile_one, TILES))
    subprocess.run([nvcc(), "-shared", "-cudart", "static", "-gencode=arch=compute_90a,code=sm_90a",
                    *map(str, objects), "-o", str(staging / lib.name)], check=True)
    shutil.rmtree(lib.parent, ignore_errors=True)  # a folder of this key without its library: an older failure
    staging.rename(lib.parent)
    print(f"conv_tiles: built {lib}")
    return lib


def distinct_convolutions(config: str) -> list[tuple[ConvolutionCall, list[str]]]:
    """The 3-frame causal convolutions of one steady decoder block, one per distinct problem (the first
    call of each, with the paths of every call it stands for). A residual block's convolutions keep
    their own entry where an otherwise equal convolution elsewhere is not split like them."""
    cfg = load_config(config)
    with torch.device("meta"):
        decoder = VideoDecoder(decoder_config(cfg))
    calls = decoder.convolution_calls(cfg.block_frames, cfg.inference.latent_height, cfg.inference.latent_width)
    groups: dict[tuple, tuple[ConvolutionCall, list[str]]] = {}
    for call in calls:
        if call.kernel[0] != 3 or call.out_channels < TAPS_BELOW:
            continue  # 1x1x1 convolutions (no history); the head's 3 outputs run as one GEMM of taps
        key = (call.in_channels, call.out_channels, call.kernel, call.frames, call.height, call.width,
               ".residual." in call.path)
        groups.setdefault(key, (call, []))[1].append(call.path)
    return list(groups.values())


def device_ms(fn, calls: int = 10, runs: int = 7) -> float:
    """Median device time of one call: CUDA events around ``calls`` calls, ``runs`` times."""
    fn()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    times = []
    for _ in range(runs):
        start.record()
        for _ in range(calls):
            fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / calls)
    return statistics.median(times)


def engine_convolution(call: ConvolutionCall, weight: torch.Tensor, bias: torch.Tensor) -> CausalConv3d:
    """The convolution as the fused decoder engine holds it (padded or split as there)."""
    kt, kh, kw = call.kernel
    conv = CausalConv3d(call.in_channels, call.out_channels, call.kernel, padding=(kt // 2, kh // 2, kw // 2))
    conv = conv.to(device=weight.device, dtype=weight.dtype)
    with torch.no_grad():
        conv.weight.copy_(weight)
        conv.bias.copy_(bias)
    conv.use_engine_form()
    if ".residual." in call.path:
        conv.split_outputs()
    return conv


def bench_one(lib: ctypes.CDLL, call: ConvolutionCall) -> dict:
    """cuDNN's engine-form call and every tile on one problem: times and errors."""
    dev, dt = torch.device("cuda"), torch.bfloat16
    kt, kh, kw = call.kernel
    gen = torch.Generator(device=dev).manual_seed(0)
    joined = torch.randn(1, call.in_channels, call.frames + kt - 1, call.height, call.width, device=dev,
                         generator=gen).to(dt).contiguous(memory_format=torch.channels_last_3d)
    fan_in = call.in_channels * kt * kh * kw
    weight = (torch.randn(call.out_channels, call.in_channels, *call.kernel, device=dev, generator=gen)
              / fan_in ** 0.5).to(dt).contiguous(memory_format=torch.channels_last_3d)
    padding = (0, kh // 2, kw // 2)
    with torch.no_grad():
        expected = F.conv3d(joined.float(), weight.float(), padding=padding)
        conv = engine_convolution(call, weight, torch.zeros(call.out_channels, device=dev, dtype=dt))
        cudnn = lambda: conv.forward_joined(joined)  # noqa: E731
        row = {"cudnn_engine_ms": [device_ms(cudnn)], "tiles": {}}
        out = torch.empty_like(expected, dtype=dt, memory_format=torch.channels_last_3d)
        dims = (ctypes.c_int64 * 12)(1, joined.shape[2], call.height, call.width, call.in_channels,
                                     call.out_channels, kt, kh, kw, *padding)
        stream = ctypes.c_void_p(torch.cuda.current_stream().cuda_stream)
        for tile in TILES:
            name = tile_name(tile)
            size = getattr(lib, name + "_workspace")
            size.restype = ctypes.c_size_t
            workspace = torch.empty(max(int(size(dims)), 1), dtype=torch.uint8, device=dev)
            run = getattr(lib, name)
            args = (ctypes.c_void_p(joined.data_ptr()), ctypes.c_void_p(weight.data_ptr()),
                    ctypes.c_void_p(out.data_ptr()), dims, ctypes.c_void_p(workspace.data_ptr()),
                    ctypes.c_size_t(workspace.numel()), stream)
            out.fill_(float("nan"))
            status = run(*args)
            if status:
                row["tiles"][name] = {"status": status}
                continue
            torch.cuda.synchronize()
            rel_l2 = ((out.float() - expected).norm() / expected.norm()).item()
            row["tiles"][name] = {"ms": device_ms(lambda: run(*args)), "rel_l2": rel_l2}
        row["cudnn_engine_ms"].append(device_ms(cudnn))  # again: the GPU's clock may have moved meanwhile
    return row


def bench(lib_path: Path, config: str) -> dict:
    if not torch.cuda.is_available() or torch.cuda.get_device_capability() != (9, 0):
        raise WanTrtError("bench needs a Hopper GPU (sm_90: H100/H200); `build` runs anywhere nvcc does")
    torch.backends.cudnn.benchmark = True  # as the decoder engine runs (engines/runtime/decoder.py)
    lib = ctypes.CDLL(str(lib_path))
    rows, totals = [], {"cudnn_engine_ms": 0.0, "best_ms": 0.0}
    for call, paths in distinct_convolutions(config):
        row = {"in_channels": call.in_channels, "out_channels": call.out_channels, "kernel": list(call.kernel),
               "frames": call.frames, "height": call.height, "width": call.width, "calls_per_block": len(paths),
               "paths": paths, "tflop_per_call": call.flops / 1e12, **bench_one(lib, call)}
        cudnn = min(row["cudnn_engine_ms"])
        correct = {n: t for n, t in row["tiles"].items() if "ms" in t and t["rel_l2"] <= CORRECT_REL_L2}
        best = min(correct, key=lambda n: correct[n]["ms"], default=None)
        row["best_tile"] = best
        best_ms = min(cudnn, correct[best]["ms"]) if best else cudnn
        totals["cudnn_engine_ms"] += len(paths) * cudnn
        totals["best_ms"] += len(paths) * best_ms
        print(f"{call.in_channels:4d}->{call.out_channels:4d} {tuple(call.kernel)} {call.frames}x{call.height}x"
              f"{call.width} x{len(paths)}: cuDNN {cudnn:.3f} ms, best tile {best} "
              f"{correct[best]['ms'] if best else float('nan'):.3f} ms", flush=True)
        rows.append(row)
    totals["saving_ms_per_block"] = totals["cudnn_engine_ms"] - totals["best_ms"]
    return {**provenance(), "config": config, "precision": "bf16", "library": str(lib_path),
            "engine_form": "the fused decoder engine's (--ops plugins): 65-127 output channels padded to 128, the "
                           "residual blocks' 192-channel convolutions as 128 + 64",
            "tiles": [list(t) for t in TILES], "per_block": totals, "convolutions": rows}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("step", choices=("build", "bench"))
    parser.add_argument("--cache", type=Path, default=Path("out/conv_tiles"), help="where libraries are kept")
    parser.add_argument("--config", default="universal", help="the DiT config whose decoder is measured")
    parser.add_argument("--out", type=Path, help="bench: the result file (JSON)")
    args = parser.parse_args(argv)
    try:
        lib = build(args.cache)
        if args.step == "bench":
            if args.out is None:
                raise WanTrtError("bench: --out RESULT.json is required")
            report = bench(lib, args.config)
            args.out.write_text(json.dumps(report, indent=1))
            print(json.dumps(report["per_block"], indent=1))
    except WanTrtError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
