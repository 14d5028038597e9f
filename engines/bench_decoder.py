"""The video decoder's rows of `wan-trt bench`: ms per block of each way to decode, side by side.

Rows (each decodes the same seeded latents block by block, histories carried, one device sync per
block; steady state = blocks after the second, as in the end-to-end rows: the first block runs the
first graph, the second is the steady graph's first call, with its CUDA-graph capture, cuDNN's
algorithm search or a recompile; with 2 blocks, the second):

    reference-fp16-eager     wan-trt's PyTorch decoder in fp16, one latent frame per call, as upstream
                             runs its decoder (fp16, frame by frame with its feature caches)
    reference-fp16-compile   the same under torch.compile (default mode), as upstream compiles it
    reference-fp16-compile-cudnn-benchmark
                             the same with cuDNN's benchmark mode (fastest algorithm per shape), as the
                             engines run (still upstream's layout: no channels-last, one frame per call)
    <backend>                the decoder engine (its first and steady graphs) through the registry
    <backend>+cudagraph      the same replayed as CUDA graphs (CUDA only)

Each row also gets achieved TFLOP/s from the decoder's FLOPs per block (:mod:`wan_trt.engines.flops`).
A row that raises is a failure (``failed``: why, with the traceback of anything but a user error); the
rows after it still run.
"""
from __future__ import annotations

import time
from pathlib import Path
from typing import Any, Callable

import torch

from wan_trt.decoder_spec import DecoderSpec
from wan_trt.engines.artifact import EngineMetadata
from wan_trt.engines.backends import BY_NAME
from wan_trt.engines.flops import graph_flops, roofline_ms, throughput
from wan_trt.engines.runtime.decoder import DecoderStream, paired_engines
from wan_trt.engines.runtime.finite import NonFiniteFrames, first_non_finite
from wan_trt.errors import WanTrtError, failure_text
from wan_trt.export.decoder import read_decoder
from wan_trt.export.manifest import Manifest, reference_model
from wan_trt.log import logger, stage
from wan_trt.profiling import op_class_profile, peak_memory_gib, reset_peak_memory, summarize_ms, synchronize
from wan_trt.validate.check_decoder import stream_latents

# Decoder rows leave out their first two blocks: the first graph's call, then the steady graph's first (its
# CUDA graph is captured there).
DECODER_WARMUP_BLOCKS = 2

DECODER_PROFILE = "decoder"  # the name `wan-trt bench --profile` gives the decoder engine
REFERENCE_ROWS = {  # name: (torch.compile, cuDNN benchmark mode); CUDA only
    "reference-fp16-eager": (False, False),
    "reference-fp16-compile": (True, False),
    "reference-fp16-compile-cudnn-benchmark": (True, True),
}


def check_decoder_request(directory: Path, manifests: dict[str, Manifest], engine: Path | None, device: str) -> None:
    """Refuse, before any work, a decoder bench that would run no row, or an engine of another decoder export
    than ``directory`` (whose ``manifests``, by call, :func:`read_decoder` gave)."""
    if engine is None and not str(device).startswith("cuda"):
        raise WanTrtError(f"--decoder {directory}: on --device {device} no decoder row can run (PyTorch's fp16 "
                          "decoder rows run on CUDA only); give the decoder's engine (--decoder-engine) or run "
                          "on --device cuda")
    if engine is None:
        return
    for call, paired in paired_engines(engine).items():
        if paired.manifest.sha256 != manifests[call].sha256:
            raise WanTrtError(f"--decoder-engine {engine} was built from another decoder export ({paired.directory}) "
                              f"than --decoder {directory}; give the export it was built from, or build this one")
        paired.meta.check_runs_on(device, engine, "--decoder-engine")  # the path the user gave


def time_blocks(decode: Callable[[int, torch.Tensor], Any], latents: torch.Tensor, block_frames: int) -> list[float]:
    """Seconds per block of ``decode(block_index, block_latents)``, synchronised per block."""
    seconds = []
    for b, i in enumerate(range(0, latents.shape[2], block_frames)):
        synchronize(latents.device)
        begin = time.perf_counter()
        decode(b, latents[:, :, i:i + block_frames])
        synchronize(latents.device)
        seconds.append(time.perf_counter() - begin)
    return seconds


def reference_decode(module: torch.nn.Module, compile: bool) -> Callable[[int, torch.Tensor], None]:
    """Upstream's way: one latent frame per call, the stream's first frame by the first-frame rule. A block whose
    frames come out non-finite raises (a row of an overflowing decoder is no timing), as the engine rows do."""
    fn = torch.compile(module) if compile else module
    state = {}

    @torch.no_grad()
    def decode(block: int, z: torch.Tensor) -> None:
        if block == 0:
            state["history"] = module.empty_history(1, *z.shape[-2:])
        frames = {}
        for i in range(z.shape[2]):
            frames[f"rgb of latent frame {i}"], state["history"] = fn(z[:, :, i:i + 1], state["history"],
                                                                     first=block == 0 and i == 0)
        bad = first_non_finite(frames)  # one sync, as the engine rows' check
        if bad is not None:
            raise NonFiniteFrames(f"the PyTorch decoder's frames came out non-finite (NaN or Inf) in block {block} "
                                  f"({bad}): check the VAE weights (or the precision: fp16 overflows where bf16 does "
                                  "not)")
    return decode


def engine_variants(engine: Path, device: str) -> list[str]:
    """The registry backends that run the decoder engine ``engine`` here: its own (``aoti-plugins`` for a
    package built with the fused norms), then CUDA graphs of it."""
    kind = EngineMetadata.read(engine).backend_name
    graphed = f"{kind}+cudagraph"
    return [kind] + ([graphed] if str(device).startswith("cuda") and graphed in BY_NAME else [])


def bench_decoder(directory: Path, engine: Path | None, device: str, blocks: int, profile: bool = False
                  ) -> dict[str, Any]:
    """Every decoder row this machine can run, with FLOPs and the fraction of the dense bf16 peak;
    ``profile``: also the engine's steady call by op class (:func:`profile_decode`)."""
    manifests = read_decoder(directory)
    spec = manifests["steady"].spec
    cfg = spec.config
    flops = {call: graph_flops(manifest.spec) for call, manifest in manifests.items()}
    latents = stream_latents(spec, blocks, seed=0).to(device)
    rows: dict[str, Any] = {}
    skipped: dict[str, str] = {}
    failed: dict[str, str] = {}

    def run_row(name: str, work: Callable[[], Any], what: str) -> Any:
        """``work()``'s value; None, with why in ``failed[name]``, if it raised (the rows after it still run)."""
        try:
            with stage(what):
                return work()
        except Exception as exc:
            failed[name] = failure_text(exc)
            logger.error("decoder %s failed: %s", name, failed[name].splitlines()[0])
            return None

    def record(name: str, seconds: list[float]) -> None:
        steady = summarize_ms([1e3 * s for s in seconds[DECODER_WARMUP_BLOCKS:]])  # run_bench refuses fewer blocks
        per_second = 1e3 / steady["p50"]
        rows[name] = {"block_ms": steady, "block_ms_all": [1e3 * s for s in seconds],
                      "video_fps": spec.video_frames * per_second, **throughput(flops["steady"], steady["p50"]),
                      "peak_torch_mem_gib": peak_memory_gib(device)}
        logger.info("decoder %s: %.1f ms/block p50", name, steady["p50"])

    def bench_reference(name: str, compile: bool) -> None:
        reset_peak_memory(device)
        module = reference_model(manifests["steady"], torch.float16, device)
        record(name, time_blocks(reference_decode(module, compile), latents.half(), cfg.block_frames))

    def bench_engine(name: str) -> None:
        with DecoderStream.from_engine(engine, name, device) as stream:
            reset_peak_memory(device)
            record(name, time_blocks(lambda b, z: stream.decode(z), latents.to(spec.dtype), cfg.block_frames))

    if device.startswith("cuda"):
        before = torch.backends.cudnn.benchmark  # process-wide: restored for the rows after these
        try:
            for name, (compile, benchmark) in REFERENCE_ROWS.items():
                torch.backends.cudnn.benchmark = benchmark
                run_row(name, lambda: bench_reference(name, compile), f"bench decoder {name}")
        finally:
            torch.backends.cudnn.benchmark = before
    else:
        cuda_only = f"PyTorch's fp16 decoder runs on CUDA only (--device {device})"
        skipped.update({name: cuda_only for name in REFERENCE_ROWS})
    if engine is not None:
        variants = engine_variants(engine, device)
        skipped.update({f"{variants[0]}+cudagraph": f"CUDA graphs need CUDA (--device {device})"}
                       if len(variants) == 1 and f"{variants[0]}+cudagraph" in BY_NAME else {})
        for name in variants:
            run_row(name, lambda: bench_engine(name), f"bench decoder {name}")
    report = {"export": str(directory), "graph": spec.KIND, "precision": spec.precision, "flops_per_block": flops,
              "roofline_ms_dense_bf16_h100": roofline_ms(flops["steady"]), "rows": rows, "skipped": skipped,
              "failed": failed}
    if profile and (done := run_row("profile", lambda: profile_decode(engine, device, spec),
                                    "profile the decoder engine")) is not None:
        report["profile"] = done
    return report


def profile_decode(engine: Path, device: str, spec: DecoderSpec) -> dict[str, Any]:
    """Op-class profile of one steady block decoded by the engine (its own backend, no CUDA graph:
    kernels one by one; the third block, after the first call and a warm-up), the history copies
    and the frames' uint8 conversion included."""
    backend = engine_variants(engine, device)[0]
    f = spec.config.block_frames
    latents = stream_latents(spec, 3, seed=0).to(device, spec.dtype)
    with DecoderStream.from_engine(engine, backend, device) as stream, torch.no_grad():
        for i in range(2):
            stream.decode(latents[:, :, i * f:(i + 1) * f])
        return {"backend": backend, **op_class_profile(lambda: stream.decode(latents[:, :, 2 * f:]), device)}

