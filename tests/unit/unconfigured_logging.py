"""Logging as in a script that never configures it, for tests of what checkmate shows by default."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator


@contextlib.contextmanager
def unconfigured() -> Iterator[None]:
    """Logging as in a script that never configures it (pytest's capture handlers, added to the root logger for
    each phase of a test, taken off while inside)."""
    root, package = logging.getLogger(), logging.getLogger("checkmate")
    saved = root.handlers, package.handlers, package.level
    root.handlers, package.handlers = [], []
    package.setLevel(logging.NOTSET)
    try:
        yield
    finally:
        root.handlers, package.handlers = saved[0], saved[1]
        package.setLevel(saved[2])
