"""``wan-trt export``: one denoising pass of the static-cache model as a static-shaped ONNX graph.

Stages: build the model (checkpoint or seeded random) -> torch.export + ONNX translation
(``torch.onnx.export(dynamo=True)``) -> structural check against the spec -> sample inputs
-> manifest (with the size and sha256 of every file). Everything is written into a staging
folder wan-trt creates next to ``<out>`` and renamed to ``<out>`` only when complete, so a
failed or interrupted export never leaves a directory that looks done (wan_trt/outputs.py).
"""
from __future__ import annotations

import time
from pathlib import Path

import torch

from wan_trt.config import WanConfig
from wan_trt.digest import file_digest
from wan_trt.errors import WanTrtError
from wan_trt.export.graph import check_graph
from wan_trt.export.manifest import GRAPH, SAMPLE_INPUTS, Manifest, owned_export_files
from wan_trt.export.plugin_ops import plugin_node_counts, translation_table
from wan_trt.log import logger, stage
from wan_trt.model import build_model
from wan_trt.model.checkpoint import weights_fingerprint
from wan_trt.model.static_pass import StaticPass
from wan_trt.outputs import check_out_dir, staged_dir
from wan_trt.spec import PassSpec

OPS = ("native", "plugins")
OPSETS = (18, 23)
PROTOBUF_LIMIT = 1_800_000_000  # bytes of weights above which they go to one external data file


def export_transformer(cfg: WanConfig, out: str | Path, precision: str = "bf16", weights: str | None = None,
                       seed: int = 0, ops: str = "native", opset: int = 23, overwrite: bool = False,
                       onnx: bool = True) -> Manifest:
    """Export one pass of ``cfg`` to ``out/model.onnx`` with manifest and sample inputs.

    ``onnx=False`` writes the manifest and sample inputs only (seconds instead of minutes at full
    size): what `wan-trt build --backend aoti` needs, not ONNX Runtime or TensorRT. ``overwrite``
    replaces an existing wan-trt export (never a folder holding other files or the checkpoint).

    Raises:
        WanTrtError: bad flag value, an ``out`` that may not be written, checkpoint mismatch, a graph
            that breaks its spec, or a write that failed (disk full, permissions).
    """
    out = Path(out)
    if ops not in OPS:
        raise WanTrtError(f"--ops {ops!r}: this build exports {', '.join(OPS)}")
    if opset not in OPSETS:
        raise WanTrtError(f"--opset {opset}: expected one of {OPSETS} (23: fused Attention/RMSNormalization, "
                          "18: decomposed, for TensorRT 10.x parsers)")
    if weights is not None and not Path(weights).is_file():
        raise WanTrtError(f"--weights {weights}: no such file")
    spec = PassSpec.from_config(cfg, precision)
    protect = [Path(weights)] if weights else []
    # before minutes of work; again under the lock
    check_out_dir(out, owned_export_files, overwrite=overwrite, protect=protect)
    with staged_dir(out, owned_export_files, overwrite=overwrite, protect=protect) as staging:
        manifest = _export_into(staging, cfg, spec, weights=weights, seed=seed, ops=ops, opset=opset, onnx=onnx)
    logger.info("exported %s (%s, %s, opset %d%s) to %s", cfg.name, precision, ops, opset,
                "" if onnx else ", no ONNX graph", out)
    return manifest


def _export_into(staging: Path, cfg: WanConfig, spec: PassSpec, *, weights: str | None, seed: int, ops: str,
                 opset: int, onnx: bool) -> Manifest:
    """Every file of the export, written into ``staging``; manifest.json (with the files' hashes) last."""
    begin = time.perf_counter()
    with stage(f"build {cfg.name} model ({spec.precision})"):
        model = build_model(cfg, spec.dtype, "cpu", weights, seed)
        model.sinusoid_dtype = torch.float32  # graphs keep fp32 islands; TensorRT has no float64
    table = None
    if ops == "plugins":
        model.use_plugins()
        if onnx:
            table = translation_table()
    static = StaticPass(model, spec).eval()
    feeds = spec.sample_inputs(seed)
    graph, external, counts = (_write_graph(static, feeds, spec, staging, opset, table) if onnx else (None, False, {}))
    from safetensors.torch import save
    (staging / SAMPLE_INPUTS).write_bytes(save({k: v.contiguous() for k, v in feeds.items()}))  # OSError if full
    with stage("hash weights"):
        provenance = {"source": "random", "seed": seed, "sha256": weights_fingerprint(model)}
        if weights:
            provenance.update(source="checkpoint", path=str(Path(weights).resolve()),
                              file_sha256=file_digest(weights)["sha256"])
    manifest = Manifest(spec=spec, ops=ops, opset=opset, weights=provenance, graph=graph,
                        external_data=GRAPH + ".data" if external else None, op_counts=counts,
                        export_seconds=time.perf_counter() - begin)
    manifest.write(staging)
    return manifest


def _write_graph(static: StaticPass, feeds: dict, spec: PassSpec, staging: Path, opset: int,
                 table) -> tuple[str, bool, dict[str, int]]:
    """torch.export -> ONNX into ``staging``; checked against the spec. Returns (name, external data?, op counts)."""
    with stage("torch.export -> ONNX"), torch.no_grad():
        program = torch.onnx.export(static, tuple(feeds[n] for n in spec.input_names), dynamo=True,
                                    opset_version=opset, input_names=spec.input_names,
                                    output_names=spec.output_names, custom_translation_table=table,
                                    verbose=False)
    weight_bytes = sum(t.numel() * t.element_size() for t in static.parameters())
    external = weight_bytes > PROTOBUF_LIMIT
    with stage(f"save graph ({weight_bytes / 2 ** 30:.2f} GiB of weights{', external data' if external else ''})"):
        program.save(str(staging / GRAPH), external_data=external)
        del program
    with stage("check graph against the spec"):
        counts = check_graph(staging / GRAPH, spec)
    if table is not None:
        logger.info("plugin nodes: %s", plugin_node_counts(counts))
    return GRAPH, external, counts
