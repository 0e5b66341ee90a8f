"""A JSON object on disk shared by processes: the measurement caches (`checkmate.torch_capture.profile`,
`checkmate.inductor.measure`, `checkmate.inductor.segments`).

A cache never costs a result: a file that cannot be read or written is logged as a warning and the values are
measured again; a damaged file (not JSON, not an object, or an entry its reader refuses) is logged as a warning
naming it, removed, and measured again. Nothing is read or written while the disk cache is off
(`checkmate.disk_cache`).
"""

from __future__ import annotations

import contextlib
import json
import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

from checkmate import disk_cache
from checkmate.files import write_file

log = logging.getLogger(__name__)

# Whether one entry of a cache file is well formed (for example a finite, non-negative number of seconds).
EntryCheck = Callable[[Any], bool]


def read_entries(path: Path, valid: EntryCheck) -> dict[str, Any]:
    """The file's entries; empty when the cache is off, the file is missing or unreadable, or it is damaged (then
    logged and removed, see the module doc)."""
    if not disk_cache.enabled():
        return {}
    try:
        text = path.read_text()
    except (FileNotFoundError, NotADirectoryError):
        return {}
    except OSError as error:
        log.warning("cannot read the cache file %s (%s): measuring again", path, error)
        return {}
    try:
        data = json.loads(text)
    except ValueError as error:
        return _discard(path, f"it is not JSON ({error})")
    if not isinstance(data, dict):
        return _discard(path, "it is not a JSON object")
    bad = [key for key, value in data.items() if not valid(value)]
    if bad:
        return _discard(path, f"{len(bad)} of its entries are malformed, such as {bad[0]!r}: {data[bad[0]]!r}")
    return {str(key): value for key, value in data.items()}


def merge_entries(path: Path, fresh: dict[str, Any], valid: EntryCheck) -> None:
    """Add `fresh` to the file, keeping the entries another process wrote; the file is replaced whole
    (`checkmate.files`). Nothing is written while the cache is off; a cache that cannot be written is logged."""
    if not disk_cache.enabled():
        return
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        write_file(path, json.dumps(read_entries(path, valid) | fresh))
    except OSError as error:
        log.warning("cannot write the cache file %s (%s): continuing without caching these measurements", path, error)


def finite_number(value: Any) -> bool:
    """A JSON number (not a boolean), finite and not negative: seconds or bytes."""
    return isinstance(value, int | float) and not isinstance(value, bool) and 0 <= value < float("inf")


def _discard(path: Path, why: str) -> dict[str, Any]:
    log.warning("the cache file %s is damaged (%s): ignoring and removing it, its values are measured again", path, why)
    with contextlib.suppress(OSError):  # an unwritable cache: the next write would fail and say so
        path.unlink(missing_ok=True)
    return {}
