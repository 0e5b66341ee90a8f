"""Byte quantities: parsing budgets such as "512MiB" or "1.5GB" and printing sizes."""

from __future__ import annotations

import math
import re

_UNITS = {
    "": 1,
    "b": 1,
    "kb": 10**3,
    "mb": 10**6,
    "gb": 10**9,
    "tb": 10**12,
    "kib": 2**10,
    "mib": 2**20,
    "gib": 2**30,
    "tib": 2**40,
}
_PATTERN = re.compile(r"^\s*([0-9]*\.?[0-9]+(?:[eE][+-]?[0-9]+)?)\s*([a-zA-Z]*)\s*$")


def parse_bytes(value: int | float | str) -> int:
    """Turn an int, a float or a string such as "512MiB", "1.5GB" or "4096" into whole bytes (rounded down).

    Raises:
        ValueError: for negative numbers, unknown units or text that is not a size.
    """
    if isinstance(value, bool):
        raise ValueError(f"a size must be bytes or a string like '512MiB', got {value!r}")
    if isinstance(value, (int, float)):
        if not math.isfinite(value) or value < 0:
            raise ValueError(f"a size must be a finite number of bytes >= 0, got {value!r}")
        return int(value)
    if not isinstance(value, str):
        raise ValueError(f"a size must be bytes or a string like '512MiB', got {type(value).__name__}")
    match = _PATTERN.match(value)
    if match is None or match.group(2).lower() not in _UNITS:
        raise ValueError(
            f"cannot read {value!r} as a size: write bytes, or a number with B, KB, MB, GB, KiB, MiB or GiB"
        )
    return int(float(match.group(1)) * _UNITS[match.group(2).lower()])


def format_bytes(size: float) -> str:
    """Human-readable binary size, for example 1536 -> '1.50 KiB'."""
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if abs(size) >= scale:
            return f"{size / scale:.2f} {unit}"
    return f"{int(size)} B"
