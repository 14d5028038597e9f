"""Former name of the ``wan-trt check`` module, now :mod:`wan_trt.validate.check`.

Kept so that code written against the old path still imports; ``check_export`` here keeps the
old call form ``check_export(directory, provider, blocks=..., seed=...)``.
"""
from __future__ import annotations

from pathlib import Path

from wan_trt.validate.check import CheckOptions, CheckReport
from wan_trt.validate.check import check_export as _check_export


def check_export(directory: str | Path, provider: str = "cpu", **options) -> CheckReport:
    """:func:`wan_trt.validate.check.check_export` with its options as keywords."""
    return _check_export(directory, CheckOptions(provider=provider, **options))
