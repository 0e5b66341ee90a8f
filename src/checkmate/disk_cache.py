"""Where checkmate's disk caches (plans, profiles, Inductor measures) live, and whether they may be used in the
current context.

One folder holds them all: `$CHECKMATE_CACHE_DIR` when set, else `~/.cache/checkmate` (`cache_root`); plans are in
its `plans/` folder, profiles and measures in its `profiles/` folder.

`checkmate.compile(..., cache=False)` plans inside `caching(False)`: nothing is read from the caches or written to
them, so no file appears under `$CHECKMATE_CACHE_DIR`. The switch is a context variable, so a compile with the
cache off does not turn it off for another thread.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from pathlib import Path

_ENABLED: ContextVar[bool] = ContextVar("checkmate_disk_cache", default=True)


def cache_root() -> Path:
    """The folder of every disk cache: `$CHECKMATE_CACHE_DIR`, else `~/.cache/checkmate`."""
    configured = os.environ.get("CHECKMATE_CACHE_DIR")
    return Path(configured) if configured else Path.home() / ".cache" / "checkmate"


def enabled() -> bool:
    """Whether the disk caches may be read and written here."""
    return _ENABLED.get()


@contextmanager
def caching(allowed: bool) -> Iterator[None]:
    """Inside, the disk caches are used only when `allowed` (and when an enclosing `caching` allows them)."""
    token = _ENABLED.set(allowed and _ENABLED.get())
    try:
        yield
    finally:
        _ENABLED.reset(token)
