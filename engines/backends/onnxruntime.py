"""ONNX Runtime backend (CPU or CUDA execution provider) with io-binding on torch tensors.

Inputs and outputs never leave the device: every spec tensor is bound by pointer
(bf16 included, which NumPy cannot hold). Output buffers are allocated once from the
spec and owned by the runner; a session can hand them new ones (cache swap).
"""
from __future__ import annotations

import contextlib
from pathlib import Path

import onnx
import torch

from wan_trt.engines.backends import Unavailable
from wan_trt.engines.runtime.runner import Runner
from wan_trt.errors import WanTrtError
from wan_trt.export.graph import ONNX_TYPES
from wan_trt.export.manifest import Manifest
from wan_trt.spec import PassSpec

PROVIDERS = {"cpu": "CPUExecutionProvider", "cuda": "CUDAExecutionProvider"}


def _import_ort():
    try:
        import onnxruntime
    except ImportError:
        raise WanTrtError("onnxruntime is not installed: pip install onnxruntime (CPU) or onnxruntime-gpu") from None
    return onnxruntime


def _load_errors() -> tuple[type[Exception], ...]:
    """ONNX Runtime's exception types for a graph it cannot load (not a wan-trt bug)."""
    from onnxruntime.capi import onnxruntime_pybind11_state as state
    names = ("Fail", "NotImplemented", "InvalidGraph", "InvalidProtobuf", "NoSuchFile", "InvalidArgument",
             "RuntimeException")
    return tuple(getattr(state, n) for n in names if hasattr(state, n))


def available_providers() -> list[str]:
    """ONNX Runtime's execution providers on this machine."""
    return _import_ort().get_available_providers()


def cpu_refusal(spec: PassSpec) -> str | None:
    """Why ONNX Runtime's CPU provider cannot run a graph of ``spec`` (None: it can)."""
    if spec.dtype == torch.bfloat16:
        return f"a {spec.precision} graph with bf16 I/O, and ONNX Runtime's CPU provider has no bf16 kernels"
    return None


class OnnxRuntimeRunner(Runner):
    """Runs an exported graph with ONNX Runtime; ``provider`` is 'cpu' or 'cuda'."""

    owns_outputs = True

    def __init__(self, graph: str | Path, spec: PassSpec, provider: str = "cpu"):
        if provider not in PROVIDERS:
            raise WanTrtError(f"--provider {provider!r}: expected one of {', '.join(PROVIDERS)}")
        refusal = cpu_refusal(spec) if provider == "cpu" else None
        if refusal is not None:
            same = ("" if spec.precision == "fp8" else
                    ", or export with --precision fp32 to check the same graph structure on this CPU")
            raise WanTrtError(f"{graph}: {refusal}: check it with --provider cuda on a machine with a GPU "
                              f"(onnxruntime-gpu){same}")
        if spec.dtype == torch.bfloat16:  # the CPU provider, the usual way out, refuses it (above)
            self.without_cuda = ("a bf16 graph runs on ONNX Runtime's CUDA provider only: check it on a machine with "
                                 "a GPU (onnxruntime-gpu)" + ("" if spec.precision == "fp8" else
                                                               ", or export with --precision fp32 to check the same "
                                                               "graph structure on this CPU"))
        super().__init__(spec, "cuda" if provider == "cuda" else "cpu")
        self.name = f"onnxruntime-{provider}"
        self.graph = Path(graph)
        self.export: tuple[Path, Manifest] | None = None  # (folder, manifest) whose verified files it loads
        self.provider = provider
        self.session = None
        self.outputs: dict[str, torch.Tensor] = {}

    def activate(self) -> None:
        ort = _import_ort()
        available = ort.get_available_providers()
        wanted = PROVIDERS[self.provider]
        if wanted not in available:
            raise WanTrtError(f"this machine's ONNX Runtime has no {wanted} (available: {', '.join(available)}); "
                              "install onnxruntime-gpu for --provider cuda")
        options = ort.SessionOptions()
        options.log_severity_level = 3
        provider = wanted
        if self.provider == "cuda":
            stream = torch.cuda.current_stream(self.device).cuda_stream
            # use_tf32 0: fp32 stays fp32 (the provider's default rounds fp32 matmuls and convolutions to TF32)
            provider = (wanted, {"device_id": self.device.index or 0, "user_compute_stream": str(stream),
                                 "use_tf32": "0"})
        try:
            with self._graph_for(options) as graph:
                self.session = ort.InferenceSession(str(graph), options, providers=[provider])
        except _load_errors() as exc:  # ONNX Runtime's own verdict on the graph names the cause
            raise WanTrtError(f"ONNX Runtime ({wanted}) cannot load {self.graph}: {exc}") from exc
        if self.session.get_providers()[0] != wanted:
            raise WanTrtError(f"ONNX Runtime fell back to {self.session.get_providers()} for {self.graph}")
        if self.export is not None:  # ONNX Runtime read the files by their paths, after they were verified
            directory, manifest = self.export
            manifest.require_graph_verified(directory, "after it was verified (before or while ONNX Runtime loaded it)")
        self._check_io()
        self.outputs = self.spec.allocate("outputs", self.device)

    def _check_io(self) -> None:
        """The loaded graph's inputs and outputs are its spec's: names in order, types, static shapes, and no input
        shadowed by a constant. ONNX Runtime binds by name, so a graph whose outputs were swapped would run and be
        judged output by output under the wrong names; one that lost an output failed with its own error."""
        shadowed = sorted({i.name for i in self.session.get_overridable_initializers()} & set(self.spec.input_names))
        if shadowed:
            raise WanTrtError(f"{self.graph}: input(s) {', '.join(shadowed)} also have a constant (an initializer) in "
                              "the graph, which a runtime may take instead of the input; re-export it")
        for kind, loaded, spec in (("inputs", self.session.get_inputs(), self.spec.inputs),
                                   ("outputs", self.session.get_outputs(), self.spec.outputs)):
            got = [(a.name, a.type, list(a.shape)) for a in loaded]
            want = [(t.name, f"tensor({onnx.TensorProto.DataType.Name(ONNX_TYPES[t.dtype]).lower()})", list(t.shape))
                    for t in spec]
            if got != want:
                first = next((i for i, (g, w) in enumerate(zip(got, want)) if g != w), min(len(got), len(want)))
                seen = got[first] if first < len(got) else "nothing"
                expected = want[first] if first < len(want) else "nothing"
                raise WanTrtError(f"{self.graph}: its {kind} are not those of its spec ({len(got)} vs {len(want)}; "
                                  f"{kind[:-1]} {first} is {seen}, the spec says {expected}); re-export it")

    def _graph_for(self, options) -> contextlib.AbstractContextManager[Path]:
        """The graph to load, while the session is made: plugin graphs run their wan_trt::* nodes as reference Python
        ops (CPU only), from a copy removed once loaded."""
        # deferred: the plugin ops (onnxruntime-extensions) are needed only by --ops plugins graphs
        from wan_trt.plugins.onnxruntime_ops import contrib_copy, has_plugin_nodes, register_reference_ops
        if not has_plugin_nodes(onnx.load(str(self.graph), load_external_data=False)):
            return contextlib.nullcontext(self.graph)
        if self.provider != "cpu":
            raise WanTrtError("a --ops plugins graph runs on ONNX Runtime only with --provider cpu (its fused ops "
                              "are reference Python ops there); on GPUs build it with TensorRT")
        options.register_custom_ops_library(register_reference_ops())
        return contrib_copy(self.graph)

    def deactivate(self) -> None:
        self.session = None
        self.outputs = {}

    def rebind_output(self, name: str, tensor: torch.Tensor) -> None:
        self.outputs[name] = tensor

    def infer(self, feeds: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        self.check_feeds(feeds)
        binding = self.session.io_binding()
        dev_type, dev_id = ("cuda", self.device.index or 0) if self.device.type == "cuda" else ("cpu", 0)
        for t in self.spec.inputs:
            binding.bind_input(t.name, dev_type, dev_id, ONNX_TYPES[t.dtype], list(t.shape), feeds[t.name].data_ptr())
        for t in self.spec.outputs:
            binding.bind_output(t.name, dev_type, dev_id, ONNX_TYPES[t.dtype], list(t.shape),
                                self.outputs[t.name].data_ptr())
        try:
            self.session.run_with_iobinding(binding)
        except (RuntimeError, *_load_errors()) as exc:  # the graph computes other shapes than it declares
            raise WanTrtError(f"ONNX Runtime could not run {self.graph}: {exc}") from exc
        return dict(self.outputs)


def make_runner(backend, sources) -> Runner:
    """The ``onnxruntime`` entry: the export's graph on the CUDA provider on a GPU, the CPU provider otherwise."""
    spec, manifest = sources.spec, sources.manifest
    provider = "cuda" if str(sources.device).startswith("cuda") else "cpu"
    refusal = cpu_refusal(spec) if provider == "cpu" else None  # the runner's own rule (fp16 runs there)
    if refusal is not None:
        raise Unavailable(f"{refusal} (a --device cuda bench runs the CUDA provider; or export --precision fp32)")
    if manifest.graph is None:
        raise Unavailable(f"{sources.directory} was exported with --no-onnx: it has no ONNX graph")
    if manifest.ops == "plugins":
        raise Unavailable("a --ops plugins graph's fused ops run under ONNX Runtime only as reference Python functions "
                          "(CPU only): their time says nothing of the graph's; bench its TensorRT engine, or an "
                          "--ops native export")
    if provider == "cuda" and "CUDAExecutionProvider" not in available_providers():
        raise Unavailable("this ONNX Runtime has no CUDA provider: pip install onnxruntime-gpu")
    return export_runner(sources.directory, manifest, provider)


def export_runner(directory: Path, manifest: Manifest, provider: str) -> OnnxRuntimeRunner:
    """The graph of the export in ``directory`` on ``provider``, knowing the export's weights."""
    runner = OnnxRuntimeRunner(manifest.graph_path(directory), manifest.spec, provider)
    runner.weights_sha256 = manifest.weights["sha256"]
    runner.export = (Path(directory), manifest)
    return runner


def check_runners(directory: Path, manifest: Manifest, provider: str) -> tuple[Runner, None]:
    """``wan-trt check DIR``: the export's graph on ``provider`` (the same runner for single pass and stream)."""
    return export_runner(directory, manifest, provider), None
