"""Which tensors Inductor takes each fused op's kernels to write: prints JSON {op: [[written kernel
arguments, those of them that are the op's inputs], ...]}, one entry per kernel launch.

Inductor analyses a user-defined Triton kernel's TTIR to find the tensors it writes; each one it
believes written it copies before the launch and, where that is an input of the graph (a weight), adds
to the compiled graph's outputs. Run without TRITON_INTERPRET (the interpreter's kernels cannot be
traced): ``python -m tests.plugins.written_tensors``. The kernels are traced on fake CPU tensors and
analysed for an sm_90 target; no GPU is needed.
"""
import json
from unittest import mock

import torch
import triton
from torch._higher_order_ops import triton_kernel_wrap
from torch.fx.experimental.proxy_tensor import make_fx
from triton.backends.compiler import GPUTarget

from tests.plugins.test_registry import example
from wan_trt.plugins.registry import FUSED_OPS


class Sm90Driver:
    """The active-driver calls Inductor's analysis makes, answered for an H100 without one."""

    def get_current_target(self) -> GPUTarget:
        return GPUTarget("cuda", 90, 32)

    def get_active_torch_device(self) -> torch.device:
        return torch.device("cpu")


def engine_only_kernels() -> dict:
    """Kernels that are no fused op (no TensorRT plugin) but go into AOTInductor engines: name ->
    (launcher, example inputs)."""
    from wan_trt.plugins.quantize_rows import quantize_rows_fp8
    return {"quantize_rows_fp8": (lambda x: quantize_rows_fp8(x, True), [torch.randn(3, 40)])}


def written(launch, tensors) -> list[list[list[str]]]:
    graph = make_fx(launch, tracing_mode="fake")(*tensors).graph
    launches = []
    for node in graph.nodes:
        if node.op != "call_function" or "triton_kernel_wrapper" not in str(node.target):
            continue
        args = node.kwargs["kwargs"]
        values = {k: v.meta["val"] if isinstance(v, torch.fx.Node) else v for k, v in args.items()}
        with mock.patch.object(triton.runtime.driver, "_active", Sm90Driver(), create=True):
            names = triton_kernel_wrap.get_mutated_tensors(node.kwargs["kernel_idx"], node.kwargs["constant_args_idx"],
                                                           values, node.kwargs["tma_descriptor_metadata"])
        inputs = [k for k in names if isinstance(args[k], torch.fx.Node) and args[k].op == "placeholder"]
        launches.append([names, inputs])
    return launches


if __name__ == "__main__":
    def fused(op):
        tensors, attrs = example(op)
        return written(lambda *t: op.launch(*t, *attrs), tensors)
    answer = {op.name: fused(op) for op in FUSED_OPS}
    answer.update({name: written(*kernel) for name, kernel in engine_only_kernels().items()})
    print(json.dumps(answer))
