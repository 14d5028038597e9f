"""The option groups the ``wan-trt`` commands share, and how their values are picked.

Each is a click decorator; the commands in :mod:`wan_trt.cli` stack them. Nothing here
imports torch at import time, so `wan-trt --help` stays fast.
"""
from __future__ import annotations

from typing import Callable

import click

from wan_trt.errors import WanTrtError
from wan_trt.precisions import PRECISIONS as PRECISION_DTYPES


DECODERS = {"wan": "decoder", "tiny": "tiny-decoder"}  # `stream --decoder NAME` -> its graph kind (wan_trt.graphs)
MAX_SEED = 2 ** 32 - 1  # 32 bits: PyTorch's CPU generator keeps the low 32 bits of a seed (random weights)


class PathArg(click.Path):
    """A click path that refuses an empty value: `--out ""` (an unset shell variable) is a mistake, not 'no
    --out'."""

    def convert(self, value, param, ctx):
        if isinstance(value, str) and not value:
            leave = " or leave the option out" if isinstance(param, click.Option) else ""  # an argument is required
            self.fail(f"an empty path; give a path{leave}", param, ctx)
        return super().convert(value, param, ctx)


def config_option(fn: Callable) -> Callable:
    """``--config``: a preset name or a config.json path."""
    return click.option("--config", "config_name", default="universal", show_default=True,
                        help="Preset name (see `wan-trt info --list`) or path to a config.json.")(fn)


def weights_option(fn: Callable) -> Callable:
    """``--weights``: an upstream checkpoint; seeded random weights without it."""
    return click.option("--weights", type=PathArg(dir_okay=False), default=None,
                        help="Checkpoint (.safetensors/.pt) with upstream keys; seeded random weights if omitted.")(fn)


PRECISIONS = tuple(PRECISION_DTYPES)


def precision_option(default: str | None = "bf16") -> Callable:
    """``--precision`` with ``default`` (None: the command picks it, see :func:`pick_precision`)."""
    return click.option("--precision", type=click.Choice(PRECISIONS), default=default,
                        show_default=default is not None, help="Compute precision of the graph / model.")


def precision_aliases(fn: Callable) -> Callable:
    """``--bf16`` / ``--fp16`` / ``--fp32``: short spellings of ``--precision`` (``build`` keeps them)."""
    for name in reversed(PRECISIONS):
        fn = click.option(f"--{name}", "precision_alias", flag_value=name, default=None,
                          help=f"Same as --precision {name}.")(fn)
    return fn


def pick_precision(precision: str | None, alias: str | None, default: str | None = "bf16") -> str | None:
    """The precision asked by ``--precision`` or its alias flag, else ``default``; both given, they must agree."""
    if precision is not None and alias is not None and precision != alias:
        raise WanTrtError(f"--precision {precision} and --{alias} disagree; pass one of them")
    return precision or alias or default


def device_option(fn: Callable) -> Callable:
    """``--device``: a torch device, resolved by :func:`pick_device`."""
    return click.option("--device", default=None, help="torch device; defaults to cuda when available, else cpu.")(fn)


def seed_option(fn: Callable) -> Callable:
    """``--seed`` of random weights, inputs and noise."""
    return click.option("--seed", type=click.IntRange(0, MAX_SEED), default=0, show_default=True,
                        help="Seed of random weights, inputs and noise.")(fn)


def pick_device(device: str | None) -> str:
    """``--device`` as given, else cuda when available, else cpu."""
    import torch  # deferred: `wan-trt --help` and `wan-trt info` start without torch
    return device or ("cuda" if torch.cuda.is_available() else "cpu")
