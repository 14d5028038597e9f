"""TensorRT plugins for the fused ops (``tensorrt.plugin``, TensorRT 10.9+ / 11.x).

Per op ``wan_trt::<Op>`` (version 1): ``register`` (output shapes and dtypes), ``autotune``
(a few Triton block configurations as tactics), ``aot_impl`` (the same Triton kernels
compiled to PTX, embedded in the engine: the engine runs from C++ or trtexec with no
Python) and ``impl`` (the JIT form, calling the PyTorch launcher on TensorRT's stream).

All shapes are static, so every size and stride is known when the PTX is built; they
reach the kernel as int32 extra arguments, in the kernels' order (inputs, scalars,
outputs). The Triton compilation is :func:`compile_ptx`, usable without TensorRT.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable

import torch

from wan_trt.errors import WanTrtError
from wan_trt.plugins import adaln as _adaln
from wan_trt.plugins import qk_norm_rope as _qk
from wan_trt.plugins import window_attention as _wa

NAMESPACE = "wan_trt"
TRITON_TYPES = {torch.bfloat16: "bf16", torch.float16: "fp16", torch.float32: "fp32", torch.int32: "i32"}
# window attention tactics: the kernel's autotuned GPU tilings (window_attention.Tiling)
ATTENTION_TACTICS = _wa.GPU_TILINGS
_REGISTERED = False


@dataclass
class Compiled:
    name: str
    ptx: str
    shared: int
    num_warps: int


def compile_ptx(kernel, pointers: dict[str, torch.dtype], scalars: dict[str, int], outputs: dict[str, torch.dtype],
                constexprs: dict[str, Any], num_warps: int, num_stages: int, arch: int | None = None) -> Compiled:
    """Compile a Triton kernel to PTX with the given argument types, for the current GPU or for compute
    capability ``arch`` (e.g. 90; no GPU needed then). The dicts must list the kernel's parameters in
    order (TensorRT passes the scalars by position). Like Triton's launcher, it tells the compiler which
    arguments are multiples of 16, without which loads are neither vectorized nor pipelined through
    cp.async: the scalars whose value is, and every pointer. The launcher checks pointers on each call;
    an engine cannot, so this assumes TensorRT hands plugins 16-byte-aligned buffers (its allocations
    are 256-byte aligned in practice; not verifiable here)."""
    import triton
    from triton.backends.compiler import GPUTarget

    signature = {name: f"*{TRITON_TYPES[dt]}" for name, dt in pointers.items()}
    signature.update({name: "i32" for name in scalars})
    signature.update({name: f"*{TRITON_TYPES[dt]}" for name, dt in outputs.items()})
    signature.update({name: "constexpr" for name in constexprs})
    aligned = set(pointers) | set(outputs) | {name for name, value in scalars.items() if value % 16 == 0}
    attrs = {(i,): [["tt.divisibility", 16]] for i, name in enumerate(signature) if name in aligned}
    fn = kernel.fn if isinstance(kernel, triton.runtime.Autotuner) else kernel  # the JITFunction
    if list(signature) != fn.arg_names:
        raise WanTrtError(f"compile_ptx: arguments {list(signature)} are not {fn.__name__}'s parameters "
                          f"{fn.arg_names} in order")
    target = None if arch is None else GPUTarget("cuda", arch, 32)
    compiled = triton.compile(triton.compiler.ASTSource(fn=fn, signature=signature, constexprs=constexprs,
                                                        attrs=attrs),
                              target=target, options={"num_warps": num_warps, "num_stages": num_stages})
    return Compiled(compiled.metadata.name, compiled.asm["ptx"], compiled.metadata.shared, num_warps)


# ---- per-op kernel plans: argument types, int32 scalars, grid ---------------------------------

def attention_plan(q_shape, n_prev: int, dtype: torch.dtype, prev_frames: int, units: int, tactic: int,
                   arch: int | None = None):
    """(Compiled, grid, scalars) of the window attention kernel for contiguous [B, L, H, D] tensors, for the
    current GPU or compute capability ``arch``."""
    b, lq, h, d = q_shape
    tiling = ATTENTION_TACTICS[tactic]
    names = ["Q", "KP", "VP", "KC", "VC"]
    pointers = {n: dtype for n in names} | {"Valid": torch.int32}
    row = h * d
    scalars = {"stride_qb": lq * row, "stride_qm": row, "stride_qh": d, "stride_pb": n_prev * row,
               "stride_pn": row, "stride_ph": d, "stride_cb": lq * row, "stride_cn": row, "stride_ch": d,
               "stride_ob": lq * row, "stride_om": row, "stride_oh": d, "Lq": lq, "n_prev": n_prev, "n_cur": lq,
               "H": h, "prev_frames": prev_frames, "units": units}
    compiled = compile_ptx(_wa._window_attention_kernel, pointers, scalars, {"Out": dtype},
                           {"qk_scale": _wa.LOG2E / math.sqrt(d), "HEAD_DIM": d, "BLOCK_M": tiling.block_m,
                            "BLOCK_N": tiling.block_n, "TAIL_N": tiling.tail,
                            "DOT_PRECISION": _wa.dot_precision(dtype)},
                           tiling.warps, tiling.stages, arch)
    return compiled, ((lq + tiling.block_m - 1) // tiling.block_m, b * h), list(scalars.values())


def qk_norm_rope_plan(q_shape, dtype: torch.dtype, half_d: int, eps: float, arch: int | None = None):
    import triton
    b, length, c = q_shape
    block = triton.next_power_of_2(c // 2)
    warps = 4 if block <= 1024 else 8
    scalars = {"L": length, "C": c, "HALF_D": half_d, "stride_row": c, "stride_out_row": c}
    compiled = compile_ptx(_qk._qk_norm_rope_kernel,
                           {"Q": dtype, "K": dtype, "WQ": dtype, "WK": dtype, "COS": torch.float32,
                            "SIN": torch.float32}, scalars, {"QO": dtype, "KO": dtype},
                           {"eps": eps, "BLOCK_PAIRS": block}, warps, 1, arch)
    return compiled, (b * length, 2), list(scalars.values())


def adaln_plan(x_shape, x_dtype, mod_dtype, mod_shape, frames: int, eps: float, fused: bool,
               arch: int | None = None):
    """Adaln (x, a, c -> h) or AddAdaln (x, y, g, a, c -> x', h) with a/c/g of shape [B, F, 1, C] or [C]."""
    import triton
    b, length, c = x_shape
    block = triton.next_power_of_2(c)
    fb, ff = (0, 0) if len(mod_shape) == 1 else (frames * c, c)
    scalars = {"L": length, "C": c, "tokens_per_frame": length // frames}
    if fused:
        scalars |= {"stride_gb": frames * c, "stride_gf": c}
        pointers = {"X": x_dtype, "Y": mod_dtype, "G": mod_dtype, "A": mod_dtype, "Cb": mod_dtype}
        outputs = {"XO": x_dtype, "HO": mod_dtype}
    else:
        pointers = {"X": x_dtype, "A": mod_dtype, "Cb": mod_dtype}
        outputs = {"HO": mod_dtype}
    scalars |= {"stride_ab": fb, "stride_af": ff, "stride_cb": fb, "stride_cf": ff}
    kernel = _adaln._add_adaln_kernel if fused else _adaln._adaln_kernel
    compiled = compile_ptx(kernel, pointers, scalars, outputs, {"eps": eps, "BLOCK_C": block},
                           4 if block <= 1024 else 8, 1, arch)
    return compiled, (b * length,), list(scalars.values())


# ---- TensorRT registration ---------------------------------------------------------------------

def _torch_dtype(trt_dtype) -> torch.dtype:
    import tensorrt as trt
    return {trt.bfloat16: torch.bfloat16, trt.float16: torch.float16, trt.float32: torch.float32,
            trt.int32: torch.int32}[trt_dtype]


def _shape(desc) -> tuple[int, ...]:
    return tuple(int(d) for d in desc.shape)


def _aot_result(trtp, compiled: Compiled, grid, scalars):
    launch = trtp.KernelLaunchParams()
    launch.grid_x = grid[0]
    if len(grid) > 1:
        launch.grid_y = grid[1]
    launch.block_x = compiled.num_warps * 32
    launch.shared_mem = compiled.shared
    extra = trtp.SymIntExprs(len(scalars))
    for i, value in enumerate(scalars):
        extra[i] = trtp.SymInt32(value)
    return compiled.name, compiled.ptx, launch, extra


def register_plugins() -> None:
    """Register the four wan_trt plugins with TensorRT's plugin registry (once per process)."""
    global _REGISTERED
    if _REGISTERED:
        return
    from wan_trt.engines.tensorrt import import_tensorrt
    import_tensorrt()
    import tensorrt.plugin as trtp

    _register_window_attention(trtp)
    _register_qk_norm_rope(trtp)
    _register_adaln(trtp)
    _REGISTERED = True


def _jit(fn: Callable, outputs, stream, *args):
    """Run a PyTorch launcher on TensorRT's stream, writing into TensorRT's output buffers."""
    with torch.cuda.stream(torch.cuda.ExternalStream(stream)):
        results = fn(*(torch.as_tensor(a, device="cuda") if not isinstance(a, (int, float)) else a for a in args))
        results = results if isinstance(results, tuple) else (results,)
        for out, res in zip(outputs, results):
            torch.as_tensor(out, device="cuda").copy_(res)


def _register_window_attention(trtp) -> None:
    op = f"{NAMESPACE}::WindowAttention"

    @trtp.register(op)
    def desc(q: trtp.TensorDesc, k_prev: trtp.TensorDesc, v_prev: trtp.TensorDesc, k_cur: trtp.TensorDesc,
             v_cur: trtp.TensorDesc, valid_frames: trtp.TensorDesc, prev_frames: int, units: int) -> trtp.TensorDesc:
        return q.like()

    @trtp.autotune(op)
    def tune(q, k_prev, v_prev, k_cur, v_cur, valid_frames, outputs) -> list:
        t = "BF16|FP16"
        return [trtp.AutoTuneCombination(f"{t}, {t}, {t}, {t}, {t}, INT32, {t}", "LINEAR",
                                         list(range(len(ATTENTION_TACTICS))))]

    @trtp.aot_impl(op)
    def aot(q, k_prev, v_prev, k_cur, v_cur, valid_frames, prev_frames: int, units: int, outputs, tactic: int):
        compiled, grid, scalars = attention_plan(_shape(q), _shape(k_prev)[1], _torch_dtype(q.dtype), prev_frames,
                                                 units, tactic)
        return _aot_result(trtp, compiled, grid, scalars)

    @trtp.impl(op)
    def impl(q, k_prev, v_prev, k_cur, v_cur, valid_frames, prev_frames: int, units: int, outputs, stream,
             tactic: int = 0):
        _jit(_wa.window_attention, outputs, stream, q, k_prev, v_prev, k_cur, v_cur, valid_frames, prev_frames,
             units)


def _register_qk_norm_rope(trtp) -> None:
    op = f"{NAMESPACE}::QkNormRope"

    @trtp.register(op)
    def desc(q: trtp.TensorDesc, k: trtp.TensorDesc, w_q: trtp.TensorDesc, w_k: trtp.TensorDesc,
             cos: trtp.TensorDesc, sin: trtp.TensorDesc, eps: float) -> tuple[trtp.TensorDesc, trtp.TensorDesc]:
        return q.like(), k.like()

    @trtp.aot_impl(op)
    def aot(q, k, w_q, w_k, cos, sin, eps: float, outputs, tactic: int):
        compiled, grid, scalars = qk_norm_rope_plan(_shape(q), _torch_dtype(q.dtype), _shape(cos)[1], eps)
        return _aot_result(trtp, compiled, grid, scalars)

    @trtp.impl(op)
    def impl(q, k, w_q, w_k, cos, sin, eps: float, outputs, stream, tactic: int = 0):
        _jit(_qk.qk_norm_rope, outputs, stream, q, k, w_q, w_k, cos, sin, eps)


def _register_adaln(trtp) -> None:
    plain, fused = f"{NAMESPACE}::Adaln", f"{NAMESPACE}::AddAdaln"

    @trtp.register(plain)
    def desc(x: trtp.TensorDesc, a: trtp.TensorDesc, c: trtp.TensorDesc, frames: int, eps: float) -> trtp.TensorDesc:
        h = x.like()
        h.dtype = a.dtype
        return h

    @trtp.aot_impl(plain)
    def aot(x, a, c, frames: int, eps: float, outputs, tactic: int):
        compiled, grid, scalars = adaln_plan(_shape(x), _torch_dtype(x.dtype), _torch_dtype(a.dtype), _shape(a),
                                             frames, eps, fused=False)
        return _aot_result(trtp, compiled, grid, scalars)

    @trtp.impl(plain)
    def impl(x, a, c, frames: int, eps: float, outputs, stream, tactic: int = 0):
        _jit(lambda *t: _adaln.adaln(*t, t[1].dtype), outputs, stream, x, a, c, frames, eps)  # h takes a's dtype

    @trtp.register(fused)
    def desc_fused(x: trtp.TensorDesc, y: trtp.TensorDesc, g: trtp.TensorDesc, a: trtp.TensorDesc,
                   c: trtp.TensorDesc, frames: int, eps: float) -> tuple[trtp.TensorDesc, trtp.TensorDesc]:
        h = x.like()
        h.dtype = a.dtype
        return x.like(), h

    @trtp.aot_impl(fused)
    def aot_fused(x, y, g, a, c, frames: int, eps: float, outputs, tactic: int):
        compiled, grid, scalars = adaln_plan(_shape(x), _torch_dtype(x.dtype), _torch_dtype(a.dtype), _shape(a),
                                             frames, eps, fused=True)
        return _aot_result(trtp, compiled, grid, scalars)

    @trtp.impl(fused)
    def impl_fused(x, y, g, a, c, frames: int, eps: float, outputs, stream, tactic: int = 0):
        _jit(lambda *t: _adaln.add_adaln(*t, t[3].dtype), outputs, stream, x, y, g, a, c, frames, eps)
