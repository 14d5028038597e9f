"""The FP8 GEMMs of an ``fp8`` graph as standard ONNX Q/DQ (opset >= 21: blocked quantization).

``wan_trt::fp8_quantize_rows`` (:mod:`wan_trt.model.fp8`) becomes

    scale = max(ReduceMax(|x|, axis -1), MIN_AMAX) / 448                        [.., L, 1] fp32
    x8    = QuantizeLinear(x, scale, axis=-1, block_size=K, output_dtype=e4m3)  one scale per row

and ``wan_trt::fp8_linear`` becomes DequantizeLinear(x8) @ DequantizeLinear(W8^T, per output channel)
+ bias, cast to the activation dtype. ONNX Runtime runs the same arithmetic in fp32. Not verified:
a TensorRT build (its Quantize takes build-time-constant FP8 scales; per-row dynamic scales may be
refused).
"""
from __future__ import annotations

import torch
from onnx import TensorProto
from onnxscript import opset23 as op

from wan_trt.model.fp8 import E4M3_MAX, MIN_AMAX

MIN_OPSET = 21  # QuantizeLinear's block_size (one scale per row)


def quantize_rows(x):
    xf = op.Cast(x, to=TensorProto.FLOAT)
    amax = op.ReduceMax(op.Abs(xf), op.Constant(value_ints=[-1]), keepdims=1)
    scale = op.Div(op.Max(amax, op.Constant(value_float=MIN_AMAX)), op.Constant(value_float=E4M3_MAX))
    data = op.QuantizeLinear(xf, scale, axis=-1, block_size=x.shape[-1], output_dtype=TensorProto.FLOAT8E4M3FN,
                             saturate=1)
    return data, scale


def fp8_linear(data, scale, weight, weight_scale, bias, dtype: int):
    x = op.DequantizeLinear(data, scale, axis=-1, block_size=data.shape[-1])  # fp32 (the scale's type)
    w = op.DequantizeLinear(op.Transpose(weight, perm=[1, 0]), weight_scale, axis=1)  # [K, N] fp32
    y = op.Add(op.MatMul(x, w), op.Cast(bias, to=TensorProto.FLOAT))
    return op.Cast(y, to=dtype)


def translation_table() -> dict:
    """torch op overload -> ONNX function, for torch.onnx.export's ``custom_translation_table``."""
    import wan_trt.model.fp8  # noqa: F401  (defines the ops)

    return {torch.ops.wan_trt.fp8_quantize_rows.default: quantize_rows,
            torch.ops.wan_trt.fp8_linear.default: fp8_linear}
