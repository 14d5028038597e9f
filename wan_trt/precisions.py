"""The compute precisions, registered once (plain Python: the CLI lists them without importing torch).

name -> the dtype of the graph's float I/O and of its computation outside the fp32 islands. ``fp8``
computes in bf16 except the FP8 GEMMs of :mod:`wan_trt.model.fp8`; its graph's I/O is bf16.
"""
PRECISIONS = {"bf16": "bfloat16", "fp16": "float16", "fp32": "float32", "fp8": "bfloat16"}
# The precisions that only a transformer graph has (the video decoder and the streaming command's
# PyTorch model stay in the others).
ENGINE_ONLY = ("fp8",)


def pytorch_precision(name: str) -> str:
    """The precision a PyTorch model of precision ``name`` runs in: ``name`` itself, or, for an engine-only
    precision, the one of the same dtype (fp8 -> bf16: the yardstick an fp8 engine is judged against)."""
    if name not in ENGINE_ONLY:
        return name
    return next(p for p, dtype in PRECISIONS.items() if dtype == PRECISIONS[name] and p not in ENGINE_ONLY)
