"""The ``wan-trt`` command line: thin click commands over one library call each.

User errors (:class:`WanTrtError`) print one message and exit 1; bugs keep their traceback.
"""
from __future__ import annotations

import functools
import json
import sys
from pathlib import Path
from typing import Callable

import click

from wan_trt.errors import WanTrtError
from wan_trt.log import logger, setup_logging


# ---- reusable option groups ------------------------------------------------------------------

def config_option(fn: Callable) -> Callable:
    return click.option("--config", "config_name", default="universal", show_default=True,
                        help="Preset name (see `wan-trt info --list`) or path to a config.json.")(fn)


def weights_option(fn: Callable) -> Callable:
    return click.option("--weights", type=click.Path(dir_okay=False), default=None,
                        help="Checkpoint (.safetensors/.pt) with upstream keys; seeded random weights if omitted.")(fn)


def precision_option(default: str = "bf16") -> Callable:
    return click.option("--precision", type=click.Choice(["bf16", "fp16", "fp32"]), default=default,
                        show_default=True, help="Compute precision of the graph / model.")


def device_option(fn: Callable) -> Callable:
    return click.option("--device", default=None, help="torch device; defaults to cuda when available, else cpu.")(fn)


def seed_option(fn: Callable) -> Callable:
    return click.option("--seed", type=int, default=0, show_default=True,
                        help="Seed of random weights, inputs and noise.")(fn)


def pick_device(device: str | None) -> str:
    import torch
    return device or ("cuda" if torch.cuda.is_available() else "cpu")


def user_errors(fn: Callable) -> Callable:
    """Turn WanTrtError into 'error: ...' on stderr and exit status 1."""
    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except WanTrtError as exc:
            click.echo(f"error: {exc}", err=True)
            sys.exit(1)
    return wrapper


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.option("-v", "--verbose", is_flag=True, help="Debug-level log.")
def main(verbose: bool) -> None:
    """wan-trt: Matrix-Game 2.0 (CausalWanModel) from PyTorch to deployable engines."""
    setup_logging(verbose)


# ---- commands ------------------------------------------------------------------------------

@main.command()
@config_option
@click.option("--list", "list_presets", is_flag=True, help="List the built-in presets and exit.")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@user_errors
def info(config_name: str, list_presets: bool, as_json: bool) -> None:
    """Parameters, tokens, cache sizes and FLOPs of a config."""
    from wan_trt.config import load_config, preset_names
    from wan_trt.info import format_info, model_info

    if list_presets:
        names = preset_names()
        click.echo(json.dumps(names) if as_json else "\n".join(names))
        return
    data = model_info(load_config(config_name))
    click.echo(json.dumps(data, indent=2) if as_json else format_info(data))


@main.command()
@config_option
@weights_option
@precision_option("fp32")
@device_option
@seed_option
@click.option("--blocks", type=click.IntRange(1), default=8, show_default=True, help="Blocks to stream.")
@click.option("--reference/--no-reference", default=False, show_default=True,
              help="Also run the upstream-semantics pipeline and report per-block errors.")
@click.option("--out", type=click.Path(file_okay=False), default=None, help="Write latents.pt and report.json here.")
@user_errors
def stream(config_name, weights, precision, device, seed, blocks, reference, out) -> None:
    """Stream blocks of synthetic input through the static-cache runtime (PyTorch backend)."""
    from wan_trt.config import load_config
    from wan_trt.engines.run import run_stream

    report = run_stream(load_config(config_name), blocks=blocks, precision=precision, device=pick_device(device),
                        weights=weights, seed=seed, reference=reference, out=Path(out) if out else None)
    click.echo(json.dumps(report["summary"], indent=2))
    if reference and not report["summary"]["reference_match"]:
        raise WanTrtError("the static-cache stream does not match the reference pipeline (see the report)")


@main.command()
@config_option
@weights_option
@precision_option("bf16")
@seed_option
@click.option("--ops", type=click.Choice(["native"]), default="native", show_default=True,
              help="Graph flavour: plain ONNX ops.")
@click.option("--opset", type=click.Choice(["23", "18"]), default="23", show_default=True,
              help="23: fused Attention/RMSNormalization (TensorRT 11); 18: decomposed (TensorRT 10.x).")
@click.option("--out", type=click.Path(file_okay=False), default=None,
              help="Output directory. Defaults to out/<config>_<precision>_<ops>.")
@click.option("--overwrite", is_flag=True, help="Replace --out if it exists.")
@user_errors
def export(config_name, weights, precision, seed, ops, opset, out, overwrite) -> None:
    """ONNX of one denoising pass, KV caches as static-shaped inputs and outputs."""
    from wan_trt.config import load_config
    from wan_trt.export.transformer import export_transformer

    cfg = load_config(config_name)
    out = Path(out or f"out/{cfg.name}_{precision}_{ops}")
    manifest = export_transformer(cfg, out, precision, weights, seed, ops, int(opset), overwrite)
    click.echo(f"{out}: {sum(manifest.op_counts.values())} nodes, spec {manifest.spec.fingerprint()}")


@main.command()
@click.argument("directory", type=click.Path(exists=True, file_okay=False))
@click.option("--provider", type=click.Choice(["cpu", "cuda"]), default="cpu", show_default=True,
              help="ONNX Runtime execution provider (bf16/fp16 graphs need cuda: ORT-CPU has no bf16 kernels).")
@click.option("--blocks", type=click.IntRange(1), default=8, show_default=True,
              help="Blocks of the multi-block stream check.")
@click.option("--stream/--no-stream", default=True, show_default=True, help="Run the multi-block stream check.")
@seed_option
@click.option("--json", "as_json", is_flag=True, help="Print the report as JSON.")
@user_errors
def check(directory, provider, blocks, stream, seed, as_json) -> None:
    """Accuracy of an exported graph against PyTorch (Polygraphy), single pass and stream."""
    from wan_trt.validate.transformer import check_export

    report = check_export(directory, provider, blocks, seed, stream)
    click.echo(json.dumps(report.as_dict(), indent=2) if as_json else report.table())
    if not report.ok:
        raise WanTrtError("accuracy check failed:\n  " + "\n  ".join(report.problems()))


if __name__ == "__main__":
    main()
