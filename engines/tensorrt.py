"""Former home of the TensorRT backend, now :mod:`wan_trt.engines.backends.tensorrt`.

Kept so that code written against the old path (the TensorRT plugin module among it) still imports.
"""
from wan_trt.engines.backends.tensorrt import (TensorRTRunner, build_tensorrt, import_tensorrt,  # noqa: F401
                                               inspect_tensorrt)
