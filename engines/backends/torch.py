"""The PyTorch backends: the static pass run eagerly or under torch.compile (optionally with the fused
wan_trt kernels), and the reference pipeline (``reference-eager``, run by the bench itself)."""
from __future__ import annotations

import torch

from wan_trt.engines.runtime.runner import Runner
from wan_trt.errors import WanTrtError
from wan_trt.graphs import graph_kind
from wan_trt.spec import GraphSpec


class TorchRunner(Runner):
    """Runs a graph's static wrapper (:class:`StaticPass` for the DiT, ``StaticDecode`` for the decoder)
    over ``model`` on the model's device; ``compile=True`` wraps it in torch.compile. It loads nothing on entering
    ``with`` and reads inputs of any layout."""

    needs_activation = False
    strided_feeds = True

    def __init__(self, model: torch.nn.Module, spec: GraphSpec, compile: bool = False):
        super().__init__(spec, next(model.parameters()).device)
        self.name = "torch-compile" if compile else "torch"
        self.static = graph_kind(spec).static(model, spec)
        self._fn = torch.compile(self.static, fullgraph=True) if compile else self.static

    @torch.no_grad()
    def infer(self, feeds: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        self.check_feeds(feeds)
        with self.arithmetic():  # under torch.compile, its compile too (Inductor reads the settings then)
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
