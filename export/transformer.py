"""``wan-trt export``: one denoising pass of the static-cache model as a static-shaped ONNX graph
(:func:`wan_trt.export.writer.export_graph` over the pass's spec)."""
from __future__ import annotations

from pathlib import Path

from wan_trt.config import WanConfig
from wan_trt.decoder_spec import CALLS
from wan_trt.errors import WanTrtError
from wan_trt.export.decoder import decoder_dirs
from wan_trt.export.manifest import Manifest
from wan_trt.export.writer import DEFAULT_OPSET, export_graph
from wan_trt.outputs import followed
from wan_trt.spec import PassSpec


def export_transformer(cfg: WanConfig, out: str | Path, precision: str = "bf16", weights: str | None = None,
                       seed: int = 0, ops: str = "native", opset: int = DEFAULT_OPSET, overwrite: bool = False,
                       onnx: bool = True) -> Manifest:
    """Export one pass of ``cfg`` to ``out/model.onnx`` with manifest and sample inputs (see ``export_graph``)."""
    out = Path(out)
    target = followed(out)  # the folder written: a link's, '..' taken
    if decoder_dirs(target) is not None:
        raise WanTrtError(f"--out {out} holds a decoder export (first/, steady/), which a DiT export does not "
                          "replace; the DiT's graph goes into a folder of its own: pick another --out")
    if target.name in CALLS and decoder_dirs(target.parent) is not None:  # replaced, it would break the decoder's pair
        raise WanTrtError(f"--out {out} is the {target.name} graph of the decoder export {target.parent}, which a DiT "
                          "export does not replace; the DiT's graph goes into a folder of its own: pick another --out")
    return export_graph(PassSpec.from_config(cfg, precision), out, weights=weights, seed=seed, ops=ops, opset=opset,
                        overwrite=overwrite, onnx=onnx)
