"""Argument parsing shared by the subcommands."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from checkmate.errors import InvalidArgument


def key_values(items: Sequence[str], flag: str) -> dict[str, Any]:
    """`KEY=VALUE` items (from repeated `flag`s) as keyword arguments, each VALUE read as JSON when it parses, else
    as text."""
    parsed: dict[str, Any] = {}
    for item in items:
        key, separator, text = item.partition("=")
        if not separator or not key:
            raise InvalidArgument(f"{flag} {item!r} must look like KEY=VALUE")
        try:
            parsed[key] = json.loads(text)
        except json.JSONDecodeError:
            parsed[key] = text
    return parsed
