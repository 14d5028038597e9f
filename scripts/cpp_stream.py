"""The C++ runtime beside the Python session on the same engines: the same frames? how fast?

    python scripts/cpp_stream.py EXPORT ENGINE DECODER_ENGINE --blocks 10 --out RESULT.json [--device cuda]
                                 [--baseline-source DIR --rounds 2]

Builds engines/cpp (``wan_stream``) and streams ``--blocks`` blocks of the same synthetic inputs
(seed 0) through the DiT engine ``ENGINE`` (built from ``EXPORT``) and the decoder engine pair of
``DECODER_ENGINE``, once from Python (``--backend``, default aoti-plugins+cudagraph; the decoder
with ``--decoder-backend``, default the engine's own as CUDA graphs) and once from C++ (``wan_stream``, with
``--cuda-graph`` on a GPU). Records whether the uint8 frames are identical, the largest latent
difference, and per runtime the block milliseconds (p50 over the blocks after the first two) and
the stage milliseconds of every block. ``--baseline-source``: the engines/cpp folder of another version
of the C++ runtime (e.g. ``git archive REV engines/cpp``), built too; ``--rounds`` runs of each C++
runtime then alternate (this checkout's first), their steady blocks pooled into each one's p50; the
frame and latent comparisons and the stage times without a suffix are those of this checkout's first
run (``frames_max_abs_diff_each_run`` covers every run).
"""
from __future__ import annotations

import argparse
import json
import statistics
import tempfile
from pathlib import Path

import torch

from wan_trt.engines.backends import RunnerSources, get_backend, make_runner
from wan_trt.engines.bench_decoder import engine_variants
from wan_trt.engines.runtime.cpp import build_cpp, run_wan_stream, write_stream_inputs
from wan_trt.engines.runtime.decoder import DecoderStream
from wan_trt.engines.runtime.session import StreamingSession, stream_blocks
from wan_trt.export.manifest import Manifest
from wan_trt.profiling import provenance, write_result
from wan_trt.stream import NoiseSource, synthetic_stream

WARMUP = 2  # blocks left out of the p50 (CUDA-graph capture, cuDNN's algorithm search)


def compare(export: str, engine: str, decoder_engine: str, blocks: int, device: str, backend: str,
            decoder_backend: str, build_dir: str | None = None, baseline_source: str | None = None,
            rounds: int = 1) -> dict:
    manifest = Manifest.read(export)
    inputs = synthetic_stream(manifest.spec.config, blocks, seed=0)
    sources = RunnerSources(manifest.spec, device, model=None, manifest=manifest, directory=Path(export),
                            engines={get_backend(backend).engine_key: Path(engine)})
    with make_runner(backend, sources) as runner, \
            DecoderStream.from_engine(decoder_engine, decoder_backend, device) as decoder:
        results = stream_blocks(StreamingSession(runner, noise=NoiseSource(0), decoder=decoder), inputs, blocks,
                                keep_frames_on="cpu")
    python_frames = torch.cat([r.frames for r in results])
    python_latents = torch.cat([r.latents.cpu() for r in results], dim=2)
    cuda = device.startswith("cuda")
    runs: dict[str, list] = {"cpp": []} if baseline_source is None else {"cpp": [], "cpp_baseline": []}
    with tempfile.TemporaryDirectory() as tmp:
        build = Path(build_dir or Path(tmp) / "build")
        exes = {"cpp": build_cpp(build)}
        if baseline_source is not None:
            exes["cpp_baseline"] = build_cpp(build.with_name(build.name + "_baseline"), source=baseline_source)
        stream_inputs = write_stream_inputs(inputs, Path(tmp) / "in.pt")
        for i in range(rounds):
            for name, exe in exes.items():  # an output of its own per run: a baseline's may carry no record
                runs[name].append(run_wan_stream(exe, Path(engine), stream_inputs, blocks, Path(tmp) / f"{name}-{i}.pt",
                                                 seed=0, device=device, cuda_graph=cuda, decoder=Path(decoder_engine)))
    cpp = runs["cpp"][0]
    steady = {name: [ms for run in done for ms in run.block_ms[WARMUP:]] for name, done in runs.items()}
    diff = (cpp.frames.int() - python_frames.int()).abs()
    differing = (diff > 0).any(dim=-1)  # [N, H, W] pixels with any channel off
    python_ms = [1e3 * r.seconds for r in results]
    return {**provenance(device=device), "config": manifest.spec.config.name, "precision": manifest.spec.precision,
            "device": device, "blocks": blocks, "python_backend": backend, "python_decoder_backend": decoder_backend,
            "cpp": "wan_stream" + (" --cuda-graph" if cuda else ""),
            "video_frames": int(cpp.frames.shape[0]),
            "frames_identical": bool(torch.equal(cpp.frames, python_frames)),
            "pixels_differing": int(differing.sum()), "pixels": int(differing.numel()),
            "frames_max_abs_diff": int(diff.max()), "frames_mean_abs_diff": float(diff.float().mean()),
            "frames_max_abs_diff_per_block": [int(d.max()) for d in diff.split([len(r.frames) for r in results])],
            "latents_max_abs_diff": float((cpp.latents.float() - python_latents.float()).abs().max()),
            "frames_max_abs_diff_each_run": {name: [int((run.frames.int() - python_frames.int()).abs().max())
                                                    for run in done] for name, done in runs.items()},
            "rounds": rounds, "block_ms_p50": {"python": statistics.median(python_ms[WARMUP:]),
                                               **{name: statistics.median(ms) for name, ms in steady.items()}},
            "block_ms": {"python": python_ms, **{name: [run.block_ms for run in done] for name, done in runs.items()}},
            "stage_ms": {"python": [r.stage_ms for r in results], "cpp": cpp.stage_ms}}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("export")
    parser.add_argument("engine")
    parser.add_argument("decoder_engine")
    parser.add_argument("--blocks", type=int, default=10)
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--backend", default="aoti-plugins+cudagraph")
    parser.add_argument("--decoder-backend", help="default: the decoder engine's own backend, as CUDA graphs on a GPU")
    parser.add_argument("--build-dir", help="build engines/cpp here (kept; default: a temporary folder)")
    parser.add_argument("--baseline-source", help="engines/cpp of another version of the C++ runtime, run beside")
    parser.add_argument("--rounds", type=int, default=1, help="runs of each C++ runtime, alternating")
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    if args.rounds < 1:
        parser.error("--rounds: at least 1")
    if args.blocks <= WARMUP:
        parser.error(f"--blocks: more than {WARMUP} (the first {WARMUP} are left out of the p50)")
    decoder_backend = args.decoder_backend or engine_variants(Path(args.decoder_engine), args.device)[-1]
    report = compare(args.export, args.engine, args.decoder_engine, args.blocks, args.device, args.backend,
                     decoder_backend, args.build_dir, args.baseline_source, args.rounds)
    print(json.dumps({k: v for k, v in report.items() if k not in ("block_ms", "stage_ms")}, indent=1))
    write_result(args.out, report)


if __name__ == "__main__":
    main()
