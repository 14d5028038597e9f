"""CUDA graphs: a wrapper for any runner whose ``infer`` is capturable (AOTInductor, torch), and
:class:`CapturedCall` for the session's own work around it.

The runner's graph is captured on the first call with that call's feed tensors; a later call with the
same tensors only replays it. The session keeps its input buffers fixed for runners with
``swap_inputs = False`` and commits caches by copy: into a second set of cache buffers, so the runner
holds two graphs, one per set.
"""
from __future__ import annotations

import torch

from wan_trt.engines.runtime.runner import Runner
from wan_trt.errors import WanTrtError


class CudaGraphRunner(Runner):
    """Replays one CUDA graph per set of input addresses, up to :attr:`max_graphs` (a session alternates
    between two sets of cache buffers, :class:`~wan_trt.engines.runtime.session.StreamingSession`). The
    graphs share one memory pool: an output is valid until the next call, whichever graph that replays."""

    owns_outputs = True
    swap_inputs = False
    fixed_buffers = True  # each graph reads the feeds it was captured over and writes the outputs it captured
    max_graphs = 2

    def __init__(self, inner: Runner, warmup: int = 2):
        if inner.device.type != "cuda":
            raise WanTrtError(f"CUDA graphs need a CUDA runner; {inner.name} runs on {inner.device}")
        super().__init__(inner.spec, inner.device)
        self.inner = inner
        self.name = f"{inner.name}+cudagraph"
        self.warmup = warmup
        self.graphs: dict[tuple[int, ...], tuple[torch.cuda.CUDAGraph, dict[str, torch.Tensor]]] = {}

    def activate(self) -> None:
        self.inner.__enter__()

    def deactivate(self) -> None:
        self.graphs = {}
        self.inner.__exit__(None, None, None)

    def prepare(self, feeds: dict[str, torch.Tensor]) -> None:
        """Capture the graph over these feeds now, unless it was captured over them (nothing is replayed)."""
        key = self._key(feeds)
        if key not in self.graphs:
            self._capture(feeds, key)

    def infer(self, feeds: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        key = self._key(feeds)
        if key not in self.graphs:
            self._capture(feeds, key)
        graph, outputs = self.graphs[key]
        with torch.cuda.device(self.device):  # graphs are captured and replayed on the runner's device
            graph.replay()
        return dict(outputs)

    def _key(self, feeds: dict[str, torch.Tensor]) -> tuple[int, ...]:
        return tuple(feeds[t.name].data_ptr() if t.name in feeds else 0 for t in self.spec.inputs)

    def _capture(self, feeds: dict[str, torch.Tensor], key: tuple[int, ...]) -> None:
        if len(self.graphs) >= self.max_graphs:
            raise WanTrtError(f"{self.name}: inputs moved: a CUDA-graph runner replays graphs over at most "
                              f"{self.max_graphs} sets of input buffers, and these are another")
        self.spec.check_feeds(feeds)
        side = torch.cuda.Stream(self.device)
        side.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(side), torch.no_grad():
            for _ in range(self.warmup):
                self.inner.infer(feeds)
        torch.cuda.current_stream(self.device).wait_stream(side)
        pool = next(iter(self.graphs.values()))[0].pool() if self.graphs else None
        graph = torch.cuda.CUDAGraph()  # kept only once captured: a capture that fails is tried again next call
        with torch.cuda.device(self.device), torch.cuda.graph(graph, pool=pool), torch.no_grad():
            outputs = self.inner.infer(feeds)
        self.graphs[key] = graph, outputs


class CapturedCall:
    """``fn()`` captured once as a CUDA graph, then replayed, while the tensors it was captured over keep
    their addresses (``buffers``, compared at every :meth:`prepare`; new ones capture again, and up to
    ``keep`` captures stay, one per set of buffers: a session alternates between two cache sets). For work
    launched every block over fixed buffers (a CUDA-graph runner's outputs, the session's inputs): the
    host then launches one graph instead of its kernels one by one. ``fn`` runs only inside the
    capture, so it may be work that must not run twice (a cache shift); what it returns (tensors
    allocated in the graph's pool) is what every :meth:`replay` returns, refreshed."""

    def __init__(self, keep: int = 2):
        self.keep = keep
        self.captured: dict[tuple[int, ...], tuple[object, object]] = {}  # buffers' addresses -> (graph, result)
        self.graph = None  # the prepared capture's
        self.result = None
        self.device: torch.device | None = None
        self.captures = 0

    def prepare(self, buffers: list[torch.Tensor], fn) -> "CapturedCall":
        """Capture ``fn`` (on the buffers' device) unless it was captured over these very buffers;
        nothing runs yet. A capture that fails leaves the earlier ones in place."""
        key = tuple(t.data_ptr() for t in buffers)
        if key not in self.captured:
            self.device = buffers[0].device
            graph, result = self._capture(fn)
            if len(self.captured) >= self.keep:  # the oldest goes
                del self.captured[next(iter(self.captured))]
            self.captured[key] = graph, result
            self.captures += 1
        self.graph, self.result = self.captured[key]
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
