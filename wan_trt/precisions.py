"""The compute precisions, registered once (plain Python: the CLI lists them without importing torch).

name -> the dtype of the graph's float I/O and of its computation outside the fp32 islands. ``fp8``
computes in bf16 except the FP8 GEMMs of :mod:`wan_trt.model.fp8`; its graph's I/O is bf16.
"""
PRECISIONS = {"bf16": "bfloat16", "fp16": "float16", "fp32": "float32", "fp8": "bfloat16"}
# The precisions that only a transformer graph has (the video decoder and the streaming command's
# PyTorch model stay in the others).
ENGINE_ONLY = ("fp8",)
