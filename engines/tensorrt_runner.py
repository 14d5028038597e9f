"""TensorRT backend: a deserialized engine run with ``execute_async_v3`` on torch device buffers."""
from __future__ import annotations

from pathlib import Path

import torch

from wan_trt.engines.artifact import EngineMetadata
from wan_trt.engines.runner import Runner
from wan_trt.engines.tensorrt import import_tensorrt
from wan_trt.errors import WanTrtError
from wan_trt.export.manifest import Manifest


class TensorRTRunner(Runner):
    """Runs a TensorRT engine; outputs are owned buffers (allocated once), inputs bound by address."""

    owns_outputs = True

    def __init__(self, engine: str | Path, manifest: Manifest):
        self.engine_path = Path(engine)
        EngineMetadata.read(self.engine_path).check_against(manifest, self.engine_path)  # export + engine file
        super().__init__(manifest.spec, "cuda")
        self.ops = manifest.ops
        self.name = "tensorrt"
        self.engine = self.context = None
        self.outputs: dict[str, torch.Tensor] = {}

    def activate(self) -> None:
        trt = import_tensorrt()
        if self.ops == "plugins":
            from wan_trt.plugins.tensorrt_plugins import register_plugins
            register_plugins()
        runtime = trt.Runtime(trt.Logger(trt.Logger.WARNING))
        self.engine = runtime.deserialize_cuda_engine(self.engine_path.read_bytes())
        if self.engine is None:
            raise WanTrtError(f"{self.engine_path}: TensorRT cannot deserialize it; rebuild with this TensorRT")
        names = {self.engine.get_tensor_name(i) for i in range(self.engine.num_io_tensors)}
        expected = set(self.spec.input_names) | set(self.spec.output_names)
        if names != expected:
            raise WanTrtError(f"{self.engine_path} I/O {sorted(names)} differs from the spec {sorted(expected)}")
        self.context = self.engine.create_execution_context()
        self.outputs = self.spec.allocate("outputs", self.device)

    def deactivate(self) -> None:
        self.context = self.engine = None
        self.outputs = {}

    def rebind_output(self, name: str, tensor: torch.Tensor) -> None:
        self.outputs[name] = tensor

    def infer(self, feeds: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        self.spec.check_feeds(feeds)
        for name in self.spec.input_names:
            self.context.set_tensor_address(name, feeds[name].data_ptr())
        for name, tensor in self.outputs.items():
            self.context.set_tensor_address(name, tensor.data_ptr())
        if not self.context.execute_async_v3(torch.cuda.current_stream(self.device).cuda_stream):
            raise WanTrtError("TensorRT execute_async_v3 failed")
        return dict(self.outputs)
