"""DecoderStream: a stream's blocks decoded in order through the decoder's two graphs (any backend).

    decoder = DecoderStream(first_runner, steady_runner)   # runners of the two DecoderSpecs, or
    decoder = DecoderStream.from_engine("out/dec/steady/engine_aoti_cuda.pt2", "aoti+cudagraph", "cuda")
    with decoder:
        frames = decoder.decode(latents)   # uint8 [n, H, W, 3] on the device: n = 9, then 12 per block

The first block goes through the ``first`` graph (a stream's start: empty histories); every later
block through ``steady``, fed the histories the previous call returned. The histories live in input
buffers allocated once from the steady spec and are refreshed by copy (the runners may own and
reuse their output buffers, and CUDA graphs need fixed input addresses).
"""
from __future__ import annotations

import json
import weakref

from dataclasses import dataclass
from pathlib import Path

import torch

from wan_trt.decoder_spec import CALLS, RGB, DecoderSpec
from wan_trt.engines.artifact import EngineMetadata, export_for_engine, key_tools
from wan_trt.engines.backends import BACKENDS, RunnerSources, backend_module, get_backend
from wan_trt.engines.runtime.finite import NonFiniteFrames, first_non_finite
from wan_trt.engines.runtime.runner import Runner, check_device, checked_tensor
from wan_trt.errors import WanTrtError
from wan_trt.export.decoder import check_pair
from wan_trt.export.manifest import Manifest
from wan_trt.outputs import check_input_file
from wan_trt.spec import LATENTS, PassSpec
from wan_trt.video import to_uint8_frames


class DecoderStream:
    """Decodes consecutive blocks of one stream; :meth:`reset` starts a new stream."""

    def __init__(self, first: Runner, steady: Runner):
        for call, runner in (("first", first), ("steady", steady)):
            if not isinstance(runner, Runner):
                raise WanTrtError(f"the decoder's {call} runner: expected a Runner (a decoder graph's: "
                                  f"DecoderStream.from_engine makes both), got {type(runner).__name__}")
            if not isinstance(runner.spec, DecoderSpec) or runner.spec.call != call:
                raise WanTrtError(f"the decoder's {call} runner ({runner.name}) does not run the {call} decoder graph")
        a, b = first.spec, steady.spec
        if a.KIND != b.KIND:
            raise WanTrtError(f"the decoder's first runner ({first.name}) runs a graph of the {a.KIND}, its steady "
                              f"runner ({steady.name}) one of the {b.KIND}: give both of one decoder")
        if (a.config.to_dict(), a.precision) != (b.config.to_dict(), b.precision) or first.device != steady.device:
            raise WanTrtError("the decoder's first and steady runners are for different configs, precisions or "
                              "devices")
        weights = (first.weights_sha256, steady.weights_sha256)
        if None not in weights and weights[0] != weights[1]:
            raise WanTrtError(f"the decoder's first runner ({first.name}) runs weights {weights[0][:12]}, its steady "
                              f"runner ({steady.name}) weights {weights[1][:12]}: give both of one decoder export "
                              f"(`wan-trt export --graph {a.KIND}` writes the pair)")
        self.first, self.steady = first, steady
        self.spec = steady.spec
        self.device = steady.device
        self.feeds = self.spec.allocate("inputs", self.device)
        self.started = False
        self.active = False  # entered: its runners loaded
        self.owner: weakref.ref | None = None  # the session it is attached to: it carries that stream's histories
        self._benchmark: bool | None = None  # cuDNN's setting before the first __enter__, restored on exit

    @classmethod
    def from_engine(cls, engine: str | Path, backend: str, device: str) -> "DecoderStream":
        """Over the decoder engine pair of ``engine`` (either file), run by registry backend ``backend``
        (e.g. 'aoti', 'aoti+cudagraph'); each engine is verified against the export it was built from."""
        entry = get_backend(backend)
        if entry.engine_key is None:
            engine_backends = ", ".join(b.name for b in BACKENDS if b.engine_key)
            raise WanTrtError(f"decoder backend {backend!r} runs no engine file; a decoder engine pair runs with one "
                              f"of: {engine_backends}")
        check_device(device)
        runners = {}
        for call, e in paired_engines(engine).items():
            e.meta.check_runs_as(entry.engine_key, e.path, "decoder engine", f"run it with backend {e.meta.backend_name}")
            e.meta.check_runs_on(device, e.path, "decoder engine")
            sources = RunnerSources(e.manifest.spec, device, None, e.manifest, e.directory, {entry.engine_key: e.path})
            runners[call] = backend_module(entry).make_runner(entry, sources)
        return cls(runners["first"], runners["steady"])

    def __enter__(self) -> "DecoderStream":
        # cuDNN picks its fastest convolution algorithm per shape (measured once, on the first call):
        # on an H100 the decoder's block went from 107 to 87 ms under torch.compile. Process-wide, so
        # restored on exit.
        if self._benchmark is None:
            self._benchmark = torch.backends.cudnn.benchmark
        torch.backends.cudnn.benchmark = True
        try:
            self.first.__enter__()
            self.steady.__enter__()
        except BaseException as exc:  # nothing stays loaded or switched on by a failed enter
            self.__exit__(type(exc), exc, exc.__traceback__)
            raise
        self.active = True
        return self

    def __exit__(self, *exc) -> None:
        self.active = False
        self.steady.__exit__(*exc)
        self.first.__exit__(*exc)
        if self._benchmark is not None:
            torch.backends.cudnn.benchmark, self._benchmark = self._benchmark, None

    def check_attachable(self, spec: PassSpec) -> None:
        """Refuse a decoder whose latents are not the DiT's: another resolution, block length or precision."""
        check_attachable(self.spec, spec)

    def reset(self) -> None:
        """The next :meth:`decode` starts a stream (the first graph, empty histories)."""
        self.started = False

    def decode(self, latents: torch.Tensor) -> torch.Tensor:
        """The block's frames, uint8 [n, H, W, 3] on the device; the histories are carried to the next block.
        Frames that come out NaN/Inf (which uint8 would turn into black) are refused, :class:`NonFiniteFrames`,
        the histories left as they were: one device sync."""
        return self._decode(latents, to_uint8_frames, checked=True)

    def decode_rgb(self, latents: torch.Tensor) -> torch.Tensor:
        """The block's frames as the graph returns them, fp32 [1, 3, n, H, W] in [-1, 1] (valid until the
        next call: a runner may reuse its output buffers); not checked: NaN/Inf come out as they are."""
        return self._decode(latents, lambda rgb: rgb)

    @torch.no_grad()
    def _decode(self, latents: torch.Tensor, frames_of, checked: bool = False) -> torch.Tensor:
        """Run the call, make its frames, then carry the histories: a failure before that changes nothing. The
        latents' values are copied in (an autograd graph they are part of is not kept)."""
        if not self.active:
            raise WanTrtError("the decoder is not active: use it in a `with decoder:` block, or attach it to a "
                              "session, whose start() activates it")
        checked_tensor("decoder latents", latents, self.spec.tensor(LATENTS).shape, "a decoder call")
        runner = self.steady if self.started else self.first
        self.feeds[LATENTS].copy_(latents)
        feeds = self.feeds if self.started else {LATENTS: self.feeds[LATENTS]}
        outputs = runner.infer(feeds)
        if checked and first_non_finite({RGB: outputs[RGB]}) is not None:
            if first_non_finite({LATENTS: latents}) is not None:  # asked only now: no sync where all is well
                raise NonFiniteFrames("the decoder's latents are non-finite (NaN or Inf), and so came its frames; its "
                                      "histories were not carried on: check what made the latents")
            raise NonFiniteFrames(f"the decoder's frames ({RGB}) came out non-finite (NaN or Inf); its histories "
                                  "were not carried on: check the VAE weights (or the precision: fp16 overflows "
                                  "where bf16 does not)")
        frames = frames_of(outputs[RGB])
        pairs = self.spec.histories  # one multi-tensor copy (channels last both: a plain copy)
        torch._foreach_copy_([self.feeds[name] for name, _ in pairs], [outputs[nxt] for _, nxt in pairs])
        self.started = True
        return frames


def decoder_engines(engine: Path) -> dict[str, Path]:
    """A decoder engine is one file per graph, same name, in the decoder export's first/ and steady/."""
    engine = Path(engine)
    check_input_file(engine, "decoder engine")  # a mistyped path is no pair's missing half
    folder = engine.resolve().parent
    if folder.name not in CALLS:  # a DiT's engine, say: no pair to look for (a pair may be copied without exports)
        raise WanTrtError(f"decoder engine {engine}: {folder} is not first/ or steady/ of a decoder export (`wan-trt "
                          "export --graph decoder`), where `wan-trt build DECODER_EXPORT` writes the decoder's two "
                          "engines, one per graph; give one of those")
    root = folder.parent
    pair = {call: root / call / engine.name for call in CALLS}
    missing = [str(p) for p in pair.values() if not p.is_file()]
    if missing:
        raise WanTrtError(f"decoder engine {engine}: its other graph's engine {', '.join(missing)} is missing; build "
                          f"both with `wan-trt build {root}`")
    return pair


@dataclass(frozen=True)
class PairedEngine:
    """One engine of a decoder engine pair, with its metadata and the export it was built from."""

    path: Path
    meta: EngineMetadata
    directory: Path
    manifest: Manifest


def paired_engines(engine: str | Path) -> dict[str, PairedEngine]:
    """Both engines of the decoder engine pair of ``engine`` (either file), by call, each with the export
    it was built from; refused unless the two exports are one decoder's (:func:`check_pair`)."""
    pair = {}
    for call, path in decoder_engines(engine).items():
        meta = EngineMetadata.read(path)
        pair[call] = PairedEngine(path, meta, *export_for_engine(path, meta))
    check_pair({call: e.manifest for call, e in pair.items()}, f"decoder engine {engine}")
    built = {call: _build_of(e.meta) for call, e in pair.items()}
    first, steady = built.values()
    differ = [k for k in first if first[k] != steady[k]]
    if differ:  # one `wan-trt build` of the pair builds both alike; a check reports one
        raise WanTrtError(f"decoder engine {engine}: its two engines were built differently ("
                          + ", ".join(f"{call}: " + "; ".join(f"{k} {b[k]}" for k in differ)
                                      for call, b in built.items())
                          + "); build both with one `wan-trt build` of the decoder export")
    return pair


# What a build records in an engine's metadata beside its options: the layers TensorRT made of each graph (the two
# graphs differ).
NOT_BUILD_OPTIONS = ("layers",)


def _build_of(meta: EngineMetadata) -> dict[str, str]:
    """How an engine was built, as one build of a decoder pair builds both alike: the backend that runs it, the device,
    the build's own options (TensorRT's optimisation level, typing, ...) and the tools' versions its key holds."""
    options = {k: v for k, v in meta.extra.items() if k not in NOT_BUILD_OPTIONS}
    tools = key_tools(meta.versions)
    return {"backend": meta.backend_name, "device": meta.device,
            "options": json.dumps(options, sort_keys=True), "versions": json.dumps(tools, sort_keys=True)}


def check_attachable(decoder: DecoderSpec, spec: PassSpec) -> None:
    """Refuse a decoder graph whose latents are not the DiT pass's: another resolution, block length or precision."""
    want, have = spec.tensor(LATENTS), decoder.tensor(LATENTS)
    if (want.shape, want.dtype) != (have.shape, have.dtype):
        raise WanTrtError(f"the decoder takes latents {list(have.shape)} {have.dtype}, the DiT "
                          f"({spec.config.name}, {spec.precision}) makes {list(want.shape)} {want.dtype}: "
                          "export and build the decoder from the same config, in the DiT's latent dtype "
                          "(the same precision; bf16 for an fp8 DiT)")
