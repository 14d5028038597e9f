"""``wan-trt export --graph decoder`` (or ``tiny-decoder``): a video decoder's two graphs (:mod:`wan_trt.decoder_spec`).

``OUT/first`` and ``OUT/steady`` are each a complete export (manifest, graph, sample inputs; the
manifest's spec says which call it serves), written and replaced under the same rules as the DiT's, and
as one: both folders are checked before any work and swapped in only when both are written.
``OUT`` itself only holds them: build, check and stream take ``OUT`` and find both.
"""
from __future__ import annotations

from pathlib import Path

from wan_trt.config import WanConfig
from wan_trt.decoder_spec import CALLS, DecoderSpec
from wan_trt.errors import WanTrtError
from wan_trt.export.manifest import MANIFEST, Manifest
from wan_trt.export.writer import DEFAULT_OPSET, export_graphs
from wan_trt.graphs import GRAPH_KINDS
from wan_trt.outputs import followed, marked_kind


def export_decoder(cfg: WanConfig, out: str | Path, precision: str = "bf16", weights: str | None = None,
                   seed: int = 0, opset: int = DEFAULT_OPSET, overwrite: bool = False, onnx: bool = True,
                   kind: str = DecoderSpec.KIND) -> dict[str, Manifest]:
    """Export the decoder of ``cfg`` (``kind``: 'decoder', Wan2.1's VAE decoder, or 'tiny-decoder') into
    ``out/first`` and ``out/steady``; ``weights``: its checkpoint (a Wan2.1 VAE, or TAEHV's taew2_1.pth; seeded
    random weights when None). Returns the manifests by call."""
    decoders = [name for name, k in GRAPH_KINDS.items() if issubclass(k.spec, DecoderSpec)]
    if kind not in decoders:
        raise WanTrtError(f"--graph {kind}: not a video decoder; expected one of {', '.join(decoders)}")
    out = Path(out)
    if out.exists() and not out.is_dir():
        raise WanTrtError(f"--out {out}: exists and is not a folder; the decoder export is a folder of two exports")
    other = marked_kind(out)  # an output folder of wan-trt's (a stream's): no place for the graphs either
    if (out / MANIFEST).is_file() or other is not None:
        held = f"a single-graph export ({MANIFEST})" if (out / MANIFEST).is_file() else f"a wan-trt {other}"
        raise WanTrtError(f"--out {out} holds {held}; the decoder's two graphs go into a folder of their own: pick "
                          "another --out")
    for call in CALLS:  # a DiT export there is not one of a decoder's graphs, replaced with --overwrite
        held = _dit_export(followed(out / call))
        if held:
            raise WanTrtError(f"--out {out}: {out / call} holds a DiT export, which a decoder export does not replace; "
                              "the decoder's two graphs go into a folder of their own: pick another --out")
    graphs = [(GRAPH_KINDS[kind].spec.from_config(cfg, precision, call), out / call) for call in CALLS]
    manifests = export_graphs(graphs, weights=weights, seed=seed, opset=opset, overwrite=overwrite, onnx=onnx)
    return dict(zip(CALLS, manifests))


def _dit_export(directory: Path) -> bool:
    """Whether ``directory`` holds a readable export of a DiT pass (a damaged one is judged by the overwrite rules)."""
    if not (directory / MANIFEST).is_file():
        return False
    try:
        return not isinstance(Manifest.read(directory, verify=False).spec, DecoderSpec)
    except WanTrtError:
        return False


def decoder_dirs(directory: str | Path) -> dict[str, Path] | None:
    """``{call: export directory}`` when ``directory`` is a decoder export (holds first/ and steady/), else None."""
    directory = Path(directory)
    if not all((directory / call / MANIFEST).is_file() for call in CALLS):
        return None
    return {call: directory / call for call in CALLS}


def read_transformer(directory: str | Path, command: str, verify: bool = True) -> Manifest:
    """The manifest of the DiT export ``directory`` (its files verified unless ``verify`` is False), for
    ``command`` ('check' or 'bench'); a decoder export or one of its two graphs is refused, saying where it
    goes instead."""
    directory = Path(directory)
    if decoder_dirs(directory) is not None:
        _refuse_decoder(f"{directory} is a decoder export", directory, command)
    manifest = Manifest.read(directory, verify=verify)
    if isinstance(manifest.spec, DecoderSpec):
        _refuse_decoder(f"{directory} is one graph ({manifest.spec.call}) of the decoder export {directory.parent}",
                        directory.parent, command)
    return manifest


def _refuse_decoder(what: str, decoder: Path, command: str) -> None:
    where = {"check": f"check the decoder (both graphs and a stream) with `wan-trt check {decoder}`",
             "bench": f"bench the decoder beside its DiT with `wan-trt bench DIT_EXPORT --decoder {decoder}`"}
    raise WanTrtError(f"{what}; `wan-trt {command}` takes a DiT export here: {where[command]}")


def read_decoder(directory: str | Path) -> dict[str, Manifest]:
    """Both manifests of a decoder export, verified and refused unless they are one decoder's two calls."""
    dirs = decoder_dirs(directory)
    if dirs is None:
        raise WanTrtError(f"{directory} is not a decoder export (no first/ and steady/ exports in it); make one with "
                          "`wan-trt export --graph decoder`")
    manifests = {call: Manifest.read(path) for call, path in dirs.items()}
    check_pair(manifests, str(directory))
    return manifests


def check_pair(manifests: dict[str, Manifest], where: str) -> None:
    """Refuse two exports (by call) that are not one decoder's first and steady graphs."""
    for call, m in manifests.items():
        if not isinstance(m.spec, DecoderSpec) or m.spec.call != call:
            raise WanTrtError(f"{where}: its {call} export does not hold the decoder's {call} graph; re-export with "
                              "`wan-trt export --graph decoder` (or tiny-decoder)")
    kinds = {call: m.spec.KIND for call, m in manifests.items()}
    if kinds["first"] != kinds["steady"]:
        raise WanTrtError(f"{where}: first/ holds a graph of the {kinds['first']} and steady/ one of the "
                          f"{kinds['steady']}; re-export both with `wan-trt export --graph {kinds['steady']} "
                          "--overwrite`")
    made_from = {call: (m.spec.config.to_dict(), m.spec.precision, m.weights["sha256"])
                 for call, m in manifests.items()}
    if made_from["first"] != made_from["steady"]:
        raise WanTrtError(f"{where}: first/ and steady/ were exported from different configs, precisions or "
                          f"weights; re-export both with `wan-trt export --graph {kinds['steady']} --overwrite`")
