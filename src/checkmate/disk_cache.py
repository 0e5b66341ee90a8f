"""Whether checkmate may use its disk caches (plans, profiles, Inductor measures) in the current context.

`checkmate.compile(..., cache=False)` plans inside `caching(False)`: nothing is read from the caches or written to
them, so no file appears under `$CHECKMATE_CACHE_DIR`. The switch is a context variable, so a compile with the
cache off does not turn it off for another thread.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar

_ENABLED: ContextVar[bool] = ContextVar("checkmate_disk_cache", default=True)


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
