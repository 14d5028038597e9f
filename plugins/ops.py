"""The fused ops as PyTorch custom ops (``torch.ops.wan_trt.<name>``, one per registered op), usable
eagerly, under torch.compile, torch.export and AOTInductor (``triton_op``: the Triton kernels are
compiled into the package).

On CUDA tensors the Triton kernels run; on CPU tensors they run through Triton's
interpreter when ``TRITON_INTERPRET=1`` and otherwise fall back to the pure-PyTorch
references (so a plugin-flavoured model still runs, and exports, on any machine).
"""
from __future__ import annotations

import torch
from torch.library import CustomOpDef, triton_op

from wan_trt.plugins.launch import INTERPRET
from wan_trt.plugins.registry import FUSED_OPS, NAMESPACE, FusedOp, with_signature

# Under TRITON_INTERPRET the kernels cannot be traced (export / compile run these bodies on fake
# tensors), so the bodies trace the references there; eager CPU calls still reach the interpreted
# kernels through the "cpu" kernels registered below.
_trace = INTERPRET


def define(op: FusedOp) -> CustomOpDef:
    """``torch.ops.wan_trt.<op.name>`` with the registry's schema: the launcher, or the reference where
    the kernel cannot run (CPU without the interpreter) or cannot be traced (under the interpreter)."""
    reference, launch = op.reference, op.launch
    signature = op.signature(torch.Tensor, returns=True)  # the schema torch.library infers
    body = with_signature(lambda args: (reference if _trace else launch)(*args.values()), signature, op.name)
    on_cpu = with_signature(lambda args: (launch if INTERPRET else reference)(*args.values()), signature, op.name)
    custom = triton_op(f"{NAMESPACE}::{op.name}", body, mutates_args={})
    custom.register_kernel("cpu")(on_cpu)
    return custom

CUSTOM_OPS: dict[str, CustomOpDef] = {op.name: define(op) for op in FUSED_OPS}
