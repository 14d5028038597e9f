"""The runtime file: the spec and schedule of an engine in a line format the C++ runtime reads.

Written next to every engine (``<engine>.runtime.txt``) from the same :class:`PassSpec`
and :class:`BlockSchedule` the Python session uses, so the two runtimes cannot disagree:

    wan_trt_runtime 2
    config <name>            precision <bf16|fp16|fp32>
    block_frames 3           prev_frames 3          tokens_per_frame 880
    window_frames 12         ratio 4                max_stream_frames 268435456
    latent 16 44 80
    timesteps 1000 908.842712 713.979431
    sigmas 1 0.908842742 0.713979423
    clean_timestep 0
    input <name> <dtype> <dims...>
    output <name> <dtype> <dims...>
    cache <kind> <units> <prev_k> <cur_k> <prev_v> <cur_v>
    rotary <cos input> <sin input> <inverse frequencies...>

A ``rotary`` line says how to fill a rotary input pair per block: cos/sin of
``(start_frame + f) * inv_freq`` in double precision, stored fp32 (wan_trt.rotary). The
frequencies are written as Python's repr, which reads back as the same double.
"""
from __future__ import annotations

from pathlib import Path

from wan_trt.rotary import MAX_STREAM_FRAMES
from wan_trt.scheduler import BlockSchedule
from wan_trt.spec import GraphSpec, PassSpec


def runtime_text(spec: PassSpec) -> str:
    cfg, a = spec.config, spec.config.model.action_config
    sched = BlockSchedule.from_config(cfg)
    lines = ["wan_trt_runtime 2", f"config {cfg.name}", f"precision {spec.precision}",
             f"block_frames {cfg.block_frames}", f"prev_frames {cfg.prev_frames}",
             f"tokens_per_frame {cfg.tokens_per_frame}", f"window_frames {a.window_frames}",
             f"ratio {a.vae_time_compression_ratio}", f"max_stream_frames {MAX_STREAM_FRAMES}",
             f"latent {cfg.model.out_dim} {cfg.inference.latent_height} {cfg.inference.latent_width}",
             "timesteps " + " ".join(repr(t) for t in sched.timesteps),
             "sigmas " + " ".join(repr(s) for s in sched.sigmas),
             f"clean_timestep {sched.clean_timestep!r}"]
    lines += [f"input {t.name} {t.dtype} " + " ".join(map(str, t.shape)) for t in spec.inputs]
    lines += [f"output {t.name} {t.dtype} " + " ".join(map(str, t.shape)) for t in spec.outputs]
    lines += [f"cache {c.kind} {c.units} {c.prev_k} {c.cur_k} {c.prev_v} {c.cur_v}" for c in spec.caches]
    lines += [f"rotary {r.cos} {r.sin} " + " ".join(repr(f) for f in r.inv_freq) for r in spec.rotaries]
    return "\n".join(lines) + "\n"


def runtime_path(engine: Path) -> Path:
    return engine.with_name(engine.name + ".runtime.txt")


def write_runtime_file(spec: GraphSpec, engine: Path) -> Path | None:
    """The runtime file of a DiT pass engine; None for other graphs (the C++ runtime runs passes only)."""
    if not isinstance(spec, PassSpec):
        return None
    path = runtime_path(Path(engine))
    path.write_text(runtime_text(spec))
    return path
