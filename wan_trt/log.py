"""One logger for the whole toolchain, timed stages and progress bars."""
from __future__ import annotations

import contextlib
import logging
import sys
import time
from typing import Iterable, Iterator, TypeVar

T = TypeVar("T")

logger = logging.getLogger("wan_trt")


def setup_logging(verbose: bool = False) -> None:
    """Send wan_trt's log to stderr, INFO by default and DEBUG when verbose."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("[wan-trt] %(message)s"))
    logger.handlers[:] = [handler]
    logger.setLevel(logging.DEBUG if verbose else logging.INFO)
    logger.propagate = False


@contextlib.contextmanager
def stage(name: str) -> Iterator[None]:
    """Log ``name`` when it starts and its wall time when it ends."""
    logger.info("%s ...", name)
    start = time.perf_counter()
    yield
    logger.info("%s: %.1f s", name, time.perf_counter() - start)


def progress(items: Iterable[T], desc: str, total: int | None = None) -> Iterable[T]:
    """A tqdm bar on a terminal at INFO level; the bare iterable otherwise."""
    if not sys.stderr.isatty() or logger.getEffectiveLevel() > logging.INFO:
        return items
    try:
        from tqdm import tqdm
    except ImportError:
        return items
    return tqdm(items, desc=desc, total=total, leave=False)
