"""``wan-trt export``: one denoising pass of the static-cache model as a static-shaped ONNX graph.

Stages: build the model (checkpoint or seeded random) -> torch.export + ONNX translation
(``torch.onnx.export(dynamo=True)``) -> structural check against the spec -> sample inputs
-> manifest. Everything is written into ``<out>.partial`` and renamed to ``<out>`` only
when complete, so a failed or interrupted export never leaves a directory that looks done.
"""
from __future__ import annotations

import shutil
import time
from pathlib import Path

import torch

from wan_trt.config import WanConfig
from wan_trt.errors import WanTrtError
from wan_trt.export.graph import check_graph
from wan_trt.export.manifest import GRAPH, SAMPLE_INPUTS, Manifest
from wan_trt.log import logger, stage
from wan_trt.model import build_model
from wan_trt.model.checkpoint import weights_fingerprint
from wan_trt.model.static_pass import StaticPass
from wan_trt.spec import PassSpec, precision_dtype

OPS = ("native", "plugins")
OPSETS = (18, 23)
PROTOBUF_LIMIT = 1_800_000_000  # bytes of weights above which they go to one external data file


def prepare_out(out: Path, overwrite: bool) -> Path:
    """Refuse an existing ``out`` unless ``overwrite``; return the staging directory."""
    if out.exists() and not overwrite:
        raise WanTrtError(f"--out {out} already exists; pass --overwrite to replace it")
    staging = out.with_name(out.name + ".partial")
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(parents=True)
    return staging


def export_transformer(cfg: WanConfig, out: str | Path, precision: str = "bf16", weights: str | None = None,
                       seed: int = 0, ops: str = "native", opset: int = 23, overwrite: bool = False,
                       onnx: bool = True) -> Manifest:
    """Export one pass of ``cfg`` to ``out/model.onnx`` with manifest and sample inputs.

    ``onnx=False`` writes the manifest and sample inputs only (seconds instead of minutes at full
    size): what `wan-trt build --backend aoti` needs, not ONNX Runtime or TensorRT.

    Raises:
        WanTrtError: bad flag value, existing output, checkpoint mismatch, or a graph that
            breaks its spec.
    """
    out = Path(out)
    if ops not in OPS:
        raise WanTrtError(f"--ops {ops!r}: this build exports {', '.join(OPS)}")
    if opset not in OPSETS:
        raise WanTrtError(f"--opset {opset}: expected one of {OPSETS} (23: fused Attention/RMSNormalization, "
                          "18: decomposed, for TensorRT 10.x parsers)")
    spec = PassSpec.from_config(cfg, precision)
    staging = prepare_out(out, overwrite)
    begin = time.perf_counter()
    with stage(f"build {cfg.name} model ({precision})"):
        model = build_model(cfg, precision_dtype(precision), "cpu", weights, seed)
        model.sinusoid_dtype = torch.float32  # graphs keep fp32 islands; TensorRT has no float64
    table = None
    if ops == "plugins":
        model.use_plugins()
        if onnx:
            from wan_trt.export.plugin_ops import translation_table
            table = translation_table()
    static = StaticPass(model, spec).eval()
    feeds = spec.sample_inputs(seed)
    graph, external, counts = (_write_graph(static, feeds, spec, staging, opset, table) if onnx else (None, False, {}))
    from safetensors.torch import save_file
    save_file({k: v.contiguous() for k, v in feeds.items()}, str(staging / SAMPLE_INPUTS))
    with stage("hash weights"):
        provenance = {"source": "checkpoint", "path": str(Path(weights).resolve())} if weights else \
            {"source": "random", "seed": seed}
        provenance["sha256"] = weights_fingerprint(model)
    manifest = Manifest(spec=spec, ops=ops, opset=opset, weights=provenance, graph=graph,
                        external_data=GRAPH + ".data" if external else None, op_counts=counts,
                        export_seconds=time.perf_counter() - begin)
    manifest.write(staging)
    if out.exists():
        shutil.rmtree(out)
    staging.rename(out)
    logger.info("exported %s (%s, %s, opset %d%s) to %s", cfg.name, precision, ops, opset,
                "" if onnx else ", no ONNX graph", out)
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
        from wan_trt.export.plugin_ops import plugin_node_counts
        logger.info("plugin nodes: %s", plugin_node_counts(counts))
    return GRAPH, external, counts
