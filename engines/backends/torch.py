"""The PyTorch backends: the static pass run eagerly or under torch.compile (optionally with the fused
wan_trt kernels), and the reference pipeline (``reference-eager``, run by the bench itself)."""
from __future__ import annotations

import torch

from wan_trt.engines.runtime.runner import Runner
from wan_trt.errors import WanTrtError
from wan_trt.model.static_pass import StaticPass
from wan_trt.model.transformer import CausalWanModel
from wan_trt.spec import PassSpec


class TorchRunner(Runner):
    """Runs :class:`StaticPass` on the model's device; ``compile=True`` wraps it in torch.compile."""

    def __init__(self, model: CausalWanModel, spec: PassSpec, compile: bool = False):
        super().__init__(spec, model.patch_embedding.weight.device)
        self.name = "torch-compile" if compile else "torch"
        self.static_pass = StaticPass(model, spec)
        self._fn = torch.compile(self.static_pass, fullgraph=True) if compile else self.static_pass

    @torch.no_grad()
    def infer(self, feeds: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        self.spec.check_feeds(feeds)
        outputs = self._fn(*(feeds[name] for name in self.spec.input_names))
        return dict(zip(self.spec.output_names, outputs))


def make_runner(backend, sources) -> Runner:
    """The runner of a ``torch-*`` entry over the model in ``sources`` (with the fused kernels for plugins)."""
    if backend.reference_pipeline:
        raise WanTrtError(f"{backend.name} is the reference pipeline, not a static-pass runner: bench it, "
                          "or profile torch-eager instead")
    runner = TorchRunner(sources.model(backend.ops), sources.spec, compile=backend.compile)
    if backend.ops != "native":
        runner.name = backend.name
    return runner
