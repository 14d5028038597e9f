"""The runtime file: the spec (and schedule) of an engine in a line format the C++ runtime reads.

Written next to every engine (``<engine>.runtime.txt``) from the same spec (and
:class:`BlockSchedule`) the Python session uses, so the two runtimes cannot disagree. A DiT
pass engine's file:

    wan_trt_runtime 6
    engine <bytes> <sha256>  (of the engine file: the C++ runtime loads only the engine it was written for)
    device <cpu|cuda>        (the kind of device the engine was built for: the C++ runtime refuses a run on the other)
    config <name>            precision <bf16|fp16|fp32|fp8>
    block_frames 3           prev_frames 3          tokens_per_frame 880
    window_frames 12         ratio 4                max_stream_frames 268435456
    latent 16 44 80
    timesteps 1000 908.842712 713.979431
    sigmas 1 0.908842742 0.713979423
    clean_timestep 0
    input <name> <dtype> <dims...>
    output <name> <dtype> <dims...>
    cache <kind> <units> <prev_k> <cur_k> <prev_v> <cur_v>       (one line per layer of the cache)
    rotary <cos input> <sin input> <inverse frequencies...>
    sha256 <hex>             (of every byte before this line: the C++ runtime reads no edited or cut file)

A ``rotary`` line says how to fill a rotary input pair per block: cos/sin of
``(start_frame + f) * inv_freq`` in double precision, stored fp32 (wan_trt.rotary). The
frequencies are written as Python's repr, which reads back as the same double.

A decoder engine's file (one per graph of the pair; ``history`` lines in call order, for both
calls, though only the steady one takes them as inputs):

    wan_trt_decoder 6
    engine <bytes> <sha256>
    device <cpu|cuda>
    config <name>            precision <bf16|fp16|fp32>      call <first|steady>
    graph <decoder|tiny-decoder>  (the decoder's graph kind: its messages name the export command for it)
    weights <sha256>         (of the graph's weights, as its export's manifest records them: the C++ runtime pairs
                              only a first and a steady engine of the same weights, as Python's check_pair does)
    input <name> <dtype> <dims...>
    output <name> <dtype> <dims...>
    history <input> <output>
    sha256 <hex>

Both end in a ``sha256`` line: the SHA-256 of every byte before it (:func:`sealed`). The C++ runtime checks
it before it parses a field, and refuses a file without it, with another, or with a field it cannot parse.
"""
from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from wan_trt.digest import bytes_digest
from wan_trt.outputs import write_file
from wan_trt.rotary import MAX_STREAM_FRAMES
from wan_trt.scheduler import BlockSchedule
from wan_trt.decoder_spec import DecoderSpec
from wan_trt.spec import GraphSpec, PassSpec

if TYPE_CHECKING:
    from wan_trt.export.manifest import Manifest


def _io_lines(spec: GraphSpec) -> list[str]:
    return ([f"input {t.name} {t.dtype} " + " ".join(map(str, t.shape)) for t in spec.inputs]
            + [f"output {t.name} {t.dtype} " + " ".join(map(str, t.shape)) for t in spec.outputs])


def runtime_text(manifest: Manifest, engine_file: dict, device: str) -> str | None:
    """The runtime file's text for the engine file of ``manifest``'s graph, whose ``{size, sha256}`` is
    ``engine_file``, built for ``device`` (cpu, cuda or cuda:N); None for graphs the C++ runtime does not run."""
    spec = manifest.spec
    if isinstance(spec, DecoderSpec):
        return decoder_text(spec, engine_file, device, manifest.weights["sha256"])
    return pass_text(spec, engine_file, device) if isinstance(spec, PassSpec) else None


def sealed(body: str) -> str:
    """``body`` (whole lines) followed by the ``sha256`` line of its bytes, which ends a runtime file."""
    return body + f"sha256 {bytes_digest(body.encode())}\n"


def _engine_lines(engine_file: dict, device: str) -> list[str]:
    """The ``engine`` line and the ``device`` line: the kind of ``device`` only, which the C++ runtime holds
    against its --device (cuda: any of cuda, cuda:N)."""
    return [f"engine {engine_file['size']} {engine_file['sha256']}", f"device {device.partition(':')[0]}"]


def decoder_text(spec: DecoderSpec, engine_file: dict, device: str, weights_sha256: str) -> str:
    """``weights_sha256``: of the graph's weights (the manifest's), by which the C++ runtime tells a pair of one
    decoder from a first and a steady graph of two."""
    lines = ["wan_trt_decoder 6", *_engine_lines(engine_file, device), f"config {spec.config.name}",
             f"precision {spec.precision}", f"call {spec.call}", f"graph {spec.KIND}", f"weights {weights_sha256}"]
    lines += _io_lines(spec) + [f"history {i} {o}" for i, o in spec.histories]
    return sealed("\n".join(lines) + "\n")


def pass_text(spec: PassSpec, engine_file: dict, device: str) -> str:
    cfg, a = spec.config, spec.config.model.action_config
    sched = BlockSchedule.from_config(cfg)
    lines = ["wan_trt_runtime 6", *_engine_lines(engine_file, device), f"config {cfg.name}",
             f"precision {spec.precision}",
             f"block_frames {cfg.block_frames}", f"prev_frames {cfg.prev_frames}",
             f"tokens_per_frame {cfg.tokens_per_frame}", f"window_frames {a.window_frames}",
             f"ratio {a.vae_time_compression_ratio}", f"max_stream_frames {MAX_STREAM_FRAMES}",
             f"latent {cfg.model.out_dim} {cfg.inference.latent_height} {cfg.inference.latent_width}",
             "timesteps " + " ".join(repr(t) for t in sched.timesteps),
             "sigmas " + " ".join(repr(s) for s in sched.sigmas),
             f"clean_timestep {sched.clean_timestep!r}"]
    lines += _io_lines(spec)
    lines += [f"cache {c.kind} {c.units} {prev_k} {cur_k} {prev_v} {cur_v}"
              for c in spec.caches for layer in c.layers
              for (prev_k, prev_v), (cur_k, cur_v) in [(c.prev_names(layer), c.cur_names(layer))]]
    lines += [f"rotary {r.cos} {r.sin} " + " ".join(repr(f) for f in r.inv_freq) for r in spec.rotaries]
    return sealed("\n".join(lines) + "\n")


def runtime_path(engine: Path) -> Path:
    return engine.with_name(engine.name + ".runtime.txt")


def write_runtime_file(manifest: Manifest, engine: Path, engine_file: dict, device: str) -> Path | None:
    """The runtime file of ``engine``, built from the export of ``manifest`` (a DiT pass or a decoder graph) for
    ``device`` (its metadata's), written whole or not at all; None for other graphs. ``engine_file`` is the engine's
    ``{size, sha256}`` as its build recorded and verified it: the build does not hash a multi-GB file a second time
    for this."""
    text = runtime_text(manifest, engine_file, device)
    if text is None:
        return None
    path = runtime_path(Path(engine))
    write_file(path, text.encode())
    return path
