"""One graph (any registered kind, :mod:`wan_trt.graphs`) written as an export directory.

Stages: build the module (checkpoint or seeded random) -> torch.export + ONNX translation
(``torch.onnx.export(dynamo=True)``) -> structural check against the spec -> sample inputs
-> manifest (with the size and sha256 of every file). Everything is written into a staging
folder wan-trt creates next to ``<out>`` and renamed to ``<out>`` only when complete, so a
failed or interrupted export never leaves a directory that looks done (wan_trt/outputs.py).
"""
from __future__ import annotations

import contextlib
import itertools
import time
from pathlib import Path

import torch

from wan_trt.digest import file_digest, file_identity, require_unchanged
from wan_trt.errors import WanTrtError
from wan_trt.export.fp8 import MIN_OPSET as FP8_MIN_OPSET
from wan_trt.export.fp8 import translation_table as fp8_translation_table
from wan_trt.export.graph import check_graph
from wan_trt.export.manifest import GRAPH, SAMPLE_INPUTS, Manifest
from wan_trt.export.manifest_schema import OPS
from wan_trt.export.plugin_ops import plugin_node_counts, translation_table
from wan_trt.graphs import graph_kind
from wan_trt.log import logger, stage
from wan_trt.model.checkpoint import weights_fingerprint
from wan_trt.outputs import check_input_file, check_out_dir, followed, resolved, staged_dir
from wan_trt.owned import owned_export_files
from wan_trt.spec import GraphSpec

OPSETS = (18, 23)
DEFAULT_OPSET = 23
PROTOBUF_LIMIT = 1_800_000_000  # bytes of weights above which they go to one external data file


def export_graph(spec: GraphSpec, out: str | Path, *, weights: str | None = None, seed: int = 0, ops: str = "native",
                 opset: int = DEFAULT_OPSET, overwrite: bool = False, onnx: bool = True) -> Manifest:
    """Export the graph ``spec`` describes to ``out/model.onnx`` with manifest and sample inputs.

    ``onnx=False`` writes the manifest and sample inputs only (seconds instead of minutes at full
    size): what `wan-trt build --backend aoti` needs, not ONNX Runtime or TensorRT. ``overwrite``
    replaces an existing wan-trt export (never a folder holding other files or the checkpoint).

    Raises:
        WanTrtError: bad flag value, an ``out`` that may not be written, checkpoint mismatch, a graph
            that breaks its spec, or a write that failed (disk full, permissions).
    """
    return export_graphs([(spec, Path(out))], weights=weights, seed=seed, ops=ops, opset=opset, overwrite=overwrite,
                         onnx=onnx)[0]


def export_graphs(graphs: list[tuple[GraphSpec, Path]], *, weights: str | None = None, seed: int = 0,
                  ops: str = "native", opset: int = DEFAULT_OPSET, overwrite: bool = False, onnx: bool = True
                  ) -> list[Manifest]:
    """Export several graphs of one model (``(spec, out)`` each, as :func:`export_graph`) as one unit: every
    ``out`` is checked before any work, all are written into staging folders, and they are swapped into
    place only when every one is complete. A refusal or a failed write leaves every ``out`` as it was."""
    for spec, _ in graphs:
        _check_flags(spec, weights, ops, opset)
    protect = [Path(weights)] if weights else []
    read = file_identity(weights) if weights else None  # before it is read: see _provenance
    for (_, out), (_, other) in itertools.combinations(graphs, 2):  # one folder locked twice waits on itself
        if resolved(followed(out), "--out") == resolved(followed(other), "--out"):
            raise WanTrtError(f"--out: {out} and {other} are one folder (a symbolic link); the graphs go into two")
    for _, out in graphs:  # before minutes of work; again under the locks
        check_out_dir(out, owned_export_files, overwrite=overwrite, protect=protect)
    with contextlib.ExitStack() as staged:  # swapped in reverse order once all are written; none if one fails
        stagings = [staged.enter_context(staged_dir(out, owned_export_files, overwrite=overwrite, protect=protect))
                    for _, out in graphs]
        manifests = [_export_into(staging, spec, weights=weights, read=read, seed=seed, ops=ops, opset=opset,
                                  onnx=onnx)
                     for staging, (spec, _) in zip(stagings, graphs)]
    for spec, out in graphs:
        logger.info("exported %s %s (%s, %s, opset %d%s) to %s", spec.config.name, graph_kind(spec).name,
                    spec.precision, ops, opset, "" if onnx else ", no ONNX graph", out)
    return manifests


def _check_flags(spec: GraphSpec, weights: str | None, ops: str, opset: int) -> None:
    kind = graph_kind(spec)
    if ops not in OPS:
        raise WanTrtError(f"--ops {ops!r}: this build exports {', '.join(OPS)}")
    if opset not in OPSETS:
        raise WanTrtError(f"--opset {opset}: expected one of {OPSETS} (23: fused Attention/RMSNormalization, "
                          "18: decomposed, for TensorRT parsers before 10.15)")
    if spec.precision == "fp8" and opset < FP8_MIN_OPSET:
        raise WanTrtError(f"--opset {opset}: an fp8 graph needs opset {FP8_MIN_OPSET} or later (one FP8 scale per "
                          f"row is QuantizeLinear's block_size); export it with --opset 23")
    if weights is not None:
        check_input_file(weights, kind.weights_flag)


def _export_into(staging: Path, spec: GraphSpec, *, weights: str | None, read: tuple | None, seed: int, ops: str,
                 opset: int, onnx: bool) -> Manifest:
    """Every file of the export, written into ``staging``; manifest.json (with the files' hashes) last. ``read``:
    the checkpoint's :func:`~wan_trt.digest.file_identity` before the export read it."""
    begin = time.perf_counter()
    kind = graph_kind(spec)
    with stage(f"build {spec.config.name} {kind.name} ({spec.precision})"):
        module = kind.build(spec.config, spec.dtype, "cpu", weights, seed)
    with stage("hash weights"):  # as the PyTorch references hold them (before FP8 quantization)
        fingerprint = weights_fingerprint(module)
    module = kind.prepare(module, ops, spec.precision)
    table = {**(translation_table() if ops == "plugins" else {}),
             **(fp8_translation_table() if spec.precision == "fp8" else {})} if onnx else None
    static = kind.static(module, spec).eval()
    feeds = kind.sample_inputs(module, spec, seed)
    graph, external, counts = (write_graph(static, feeds, spec, staging, opset, table) if onnx else (None, False, {}))
    from safetensors.torch import save
    (staging / SAMPLE_INPUTS).write_bytes(save({k: v.contiguous() for k, v in feeds.items()}))  # OSError if full
    provenance = _provenance(spec, weights, read, seed, fingerprint)
    manifest = Manifest(spec=spec, ops=ops, opset=opset, weights=provenance, graph=graph,
                        external_data=GRAPH + ".data" if external else None, op_counts=counts,
                        export_seconds=time.perf_counter() - begin)
    manifest.write(staging)
    return manifest


def _provenance(spec: GraphSpec, weights: str | None, read: tuple | None, seed: int, fingerprint: str) -> dict:
    """Where the weights came from: the seed, or the checkpoint's path and sha256. The file is hashed after the
    export read it, so it must still be the file it was then (``read``): a file replaced or rewritten meanwhile
    would be recorded as the one exported."""
    provenance = {"source": "random", "seed": seed, "sha256": fingerprint}
    if weights:
        digest = file_digest(weights)
        require_unchanged(weights, read, graph_kind(spec).weights_flag, "while the export read it",
                          "the manifest would name another file than the one exported; nothing was written, run again")
        provenance.update(source="checkpoint", path=str(Path(weights).resolve()), file_sha256=digest["sha256"])
    return provenance


def write_graph(static: torch.nn.Module, feeds: dict, spec: GraphSpec, staging: Path, opset: int,
                table) -> tuple[str, bool, dict[str, int]]:
    """torch.export -> ONNX into ``staging``; checked against the spec. Returns (name, external data?, op counts)."""
    with stage("torch.export -> ONNX"), torch.no_grad():
        program = torch.onnx.export(static, tuple(feeds[n] for n in spec.input_names), dynamo=True,
                                    opset_version=opset, input_names=spec.input_names,
                                    output_names=spec.output_names, custom_translation_table=table,
                                    verbose=False)
    weight_bytes = sum(t.numel() * t.element_size() for t in (*static.parameters(), *static.buffers()))
    external = weight_bytes > PROTOBUF_LIMIT
    with stage(f"save graph ({weight_bytes / 2 ** 30:.2f} GiB of weights{', external data' if external else ''})"):
        program.save(str(staging / GRAPH), external_data=external)
        del program
    with stage("check graph against the spec"):
        counts = check_graph(staging / GRAPH, spec)
    if table is not None:
        logger.info("plugin nodes: %s", plugin_node_counts(counts))
    return GRAPH, external, counts
