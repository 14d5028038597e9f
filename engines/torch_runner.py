"""Former home of the PyTorch runner, now :mod:`wan_trt.engines.backends.torch`.

Kept so that code written against the old path still imports.
"""
from wan_trt.engines.backends.torch import TorchRunner  # noqa: F401
