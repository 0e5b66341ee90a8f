"""A JSON object on disk shared by processes: the profile caches (`profile`, `checkmate.inductor.measure`)."""

from __future__ import annotations

import json
import tempfile
from pathlib import Path
from typing import Any


def read_entries(path: Path) -> dict[str, Any]:
    """The file's entries; a missing, unreadable or damaged file reads as empty (the caller measures again)."""
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return {str(key): value for key, value in data.items()} if isinstance(data, dict) else {}


def merge_entries(path: Path, fresh: dict[str, Any]) -> None:
    """Add `fresh` to the file atomically (write aside, then rename), keeping the entries another process wrote."""
    path.parent.mkdir(parents=True, exist_ok=True)
    merged = read_entries(path) | fresh
    with tempfile.NamedTemporaryFile("w", dir=path.parent, suffix=".tmp", delete=False) as handle:
        json.dump(merged, handle)
    Path(handle.name).replace(path)
