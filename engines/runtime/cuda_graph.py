"""CUDA graphs: a wrapper for any runner whose ``infer`` is capturable (AOTInductor, torch), and
:class:`CapturedCall` for the session's own work around it.

The runner's graph is captured on the first call with that call's feed tensors; every later call
must pass the very same tensors (the session keeps its input buffers fixed for runners
with ``swap_inputs = False`` and commits caches by copy), then only replays.
"""
from __future__ import annotations

import torch

from wan_trt.engines.runtime.runner import Runner
from wan_trt.errors import WanTrtError


class CudaGraphRunner(Runner):
    owns_outputs = True
    swap_inputs = False
    fixed_buffers = True  # the graph reads the captured feeds and writes the captured outputs

    def __init__(self, inner: Runner, warmup: int = 2):
        if inner.device.type != "cuda":
            raise WanTrtError(f"CUDA graphs need a CUDA runner; {inner.name} runs on {inner.device}")
        super().__init__(inner.spec, inner.device)
        self.inner = inner
        self.name = f"{inner.name}+cudagraph"
        self.weights_sha256 = inner.weights_sha256
        self.warmup = warmup
        self.graph: torch.cuda.CUDAGraph | None = None
        self.pointers: dict[str, int] = {}
        self.outputs: dict[str, torch.Tensor] = {}

    def activate(self) -> None:
        self.inner.__enter__()

    def deactivate(self) -> None:
        self.graph = None
        self.outputs = {}
        self.inner.__exit__(None, None, None)

    def infer(self, feeds: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        if self.graph is None:
            self._capture(feeds)
        elif any(feeds[n].data_ptr() != p for n, p in self.pointers.items()):
            raise WanTrtError(f"{self.name}: inputs moved since capture; a CUDA-graph runner needs fixed buffers")
        with torch.cuda.device(self.device):  # graphs are captured and replayed on the runner's device
            self.graph.replay()
        return dict(self.outputs)

    def _capture(self, feeds: dict[str, torch.Tensor]) -> None:
        self.check_feeds(feeds)
        side = torch.cuda.Stream(self.device)
        side.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(side), torch.no_grad():
            for _ in range(self.warmup):
                self.inner.infer(feeds)
        torch.cuda.current_stream(self.device).wait_stream(side)
        graph = torch.cuda.CUDAGraph()  # kept only once captured: a capture that fails is tried again next call
        with torch.cuda.device(self.device), torch.cuda.graph(graph), torch.no_grad():
            outputs = self.inner.infer(feeds)
        self.graph, self.outputs = graph, outputs
        self.pointers = {n: t.data_ptr() for n, t in feeds.items()}


class CapturedCall:
    """``fn()`` captured once as a CUDA graph, then replayed, while the tensors it was captured over keep
    their addresses (``buffers``, compared at every :meth:`prepare`; a change captures again). For work
    launched every block over fixed buffers (a CUDA-graph runner's outputs, the session's inputs): the
    host then launches one graph instead of its kernels one by one. ``fn`` runs only inside the
    capture, so it may be work that must not run twice (a cache shift); what it returns (tensors
    allocated in the graph's pool) is what every :meth:`replay` returns, refreshed."""

    def __init__(self):
        self.graph: torch.cuda.CUDAGraph | None = None
        self.key: tuple[int, ...] = ()
        self.result = None
        self.device: torch.device | None = None
        self.captures = 0

    def prepare(self, buffers: list[torch.Tensor], fn) -> "CapturedCall":
        """Capture ``fn`` (on the buffers' device) unless it was captured over these very buffers;
        nothing runs yet. A capture that fails leaves the previous one in place."""
        key = tuple(t.data_ptr() for t in buffers)
        if self.graph is None or key != self.key:
            self.device = buffers[0].device
            graph, result = self._capture(fn)
            self.graph, self.result, self.key = graph, result, key
            self.captures += 1
        return self

    def _capture(self, fn):
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.device(self.device), torch.cuda.graph(graph):
            result = fn()
        return graph, result

    def replay(self):
        with torch.cuda.device(self.device):
            self.graph.replay()
        return self.result

    def __call__(self, buffers: list[torch.Tensor], fn):
        return self.prepare(buffers, fn).replay()
