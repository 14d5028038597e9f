"""The fused ops as PyTorch custom ops (namespace ``wan_trt``), usable eagerly, under
torch.compile, torch.export and AOTInductor (``triton_op``: the Triton kernels are
compiled into the package).

On CUDA tensors the Triton kernels run; on CPU tensors they run through Triton's
interpreter when ``TRITON_INTERPRET=1`` and otherwise fall back to the pure-PyTorch
references (so a plugin-flavoured model still runs, and exports, on any machine).
"""
from __future__ import annotations

import torch
from torch.library import triton_op

from wan_trt.plugins import adaln as _adaln
from wan_trt.plugins import qk_norm_rope as _qk
from wan_trt.plugins import window_attention as _wa

NAMESPACE = "wan_trt"


# Under TRITON_INTERPRET the kernels cannot be traced (export / compile run these bodies on fake
# tensors), so the bodies trace the references there; eager CPU calls still reach the interpreted
# kernels through the "cpu" kernels registered below.
_trace = _wa.INTERPRET


@triton_op(f"{NAMESPACE}::window_attention", mutates_args={})
def window_attention(q: torch.Tensor, k_prev: torch.Tensor, v_prev: torch.Tensor, k_cur: torch.Tensor,
                     v_cur: torch.Tensor, valid_frames: torch.Tensor, prev_frames: int, units: int) -> torch.Tensor:
    fn = _wa.reference_window_attention if _trace else _wa.window_attention
    return fn(q, k_prev, v_prev, k_cur, v_cur, valid_frames, prev_frames, units)


@triton_op(f"{NAMESPACE}::qk_norm_rope", mutates_args={})
def qk_norm_rope(q: torch.Tensor, k: torch.Tensor, w_q: torch.Tensor, w_k: torch.Tensor, cos: torch.Tensor,
                 sin: torch.Tensor, eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    return (_qk.reference_qk_norm_rope if _trace else _qk.qk_norm_rope)(q, k, w_q, w_k, cos, sin, eps)


@triton_op(f"{NAMESPACE}::adaln", mutates_args={})
def adaln(x: torch.Tensor, a: torch.Tensor, c: torch.Tensor, frames: int, eps: float) -> torch.Tensor:
    """h = LN(x) * a[f] + c[f], h in a's dtype."""
    return (_adaln.reference_adaln if _trace else _adaln.adaln)(x, a, c, frames, eps, a.dtype)


@triton_op(f"{NAMESPACE}::add_adaln", mutates_args={})
def add_adaln(x: torch.Tensor, y: torch.Tensor, g: torch.Tensor, a: torch.Tensor, c: torch.Tensor, frames: int,
              eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    """(x + y * g[f], LN(...) * a[f] + c[f]); the residual keeps x's dtype, h takes a's."""
    return (_adaln.reference_add_adaln if _trace else _adaln.add_adaln)(x, y, g, a, c, frames, eps, a.dtype)


def _cpu(kernel, reference):
    def run(*args):
        return kernel(*args) if _wa.INTERPRET else reference(*args)
    return run


window_attention.register_kernel("cpu")(_cpu(_wa.window_attention,
                                             _wa.reference_window_attention))
qk_norm_rope.register_kernel("cpu")(_cpu(_qk.qk_norm_rope, _qk.reference_qk_norm_rope))
adaln.register_kernel("cpu")(_cpu(lambda x, a, c, f, e: _adaln.adaln(x, a, c, f, e, a.dtype),
                                  lambda x, a, c, f, e: _adaln.reference_adaln(x, a, c, f, e, a.dtype)))
add_adaln.register_kernel("cpu")(_cpu(lambda x, y, g, a, c, f, e: _adaln.add_adaln(x, y, g, a, c, f, e, a.dtype),
                                      lambda x, y, g, a, c, f, e: _adaln.reference_add_adaln(x, y, g, a, c, f, e,
                                                                                             a.dtype)))
