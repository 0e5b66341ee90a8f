"""Byte quantities: parsing sizes such as "512MiB" or "1.5GB", budgets (bytes or a fraction of the peak without
rematerialization, as `checkmate.compile` and the command line take them) and printing sizes."""

from __future__ import annotations

import math
import numbers
import re

from checkmate.errors import InvalidArgument

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
_NUMBER = re.compile(r"^[+-]?(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][+-]?[0-9]+)?$")
_WHOLE = re.compile(r"^\+?[0-9]+$")
_BUDGET_FORMS = "bytes (1000000), a size such as '8GiB' or '512MiB', or a fraction in (0, 1] of the no-remat peak"


def parse_bytes(value: int | float | str) -> int:
    """Turn an int, a float or a string such as "512MiB", "1.5GB" or "4096" into whole bytes (rounded down).

    Raises:
        ValueError: for negative numbers, unknown units or text that is not a size.
    """
    if isinstance(value, bool):
        raise InvalidArgument(f"a size must be bytes or a string like '512MiB', got {value!r}")
    if isinstance(value, (int, float)):
        if not math.isfinite(value) or value < 0:
            raise InvalidArgument(f"a size must be a finite number of bytes >= 0, got {value!r}")
        return int(value)
    if not isinstance(value, str):
        raise InvalidArgument(f"a size must be bytes or a string like '512MiB', got {type(value).__name__}")
    match = _PATTERN.match(value)
    if match is None or match.group(2).lower() not in _UNITS:
        raise InvalidArgument(
            f"cannot read {value!r} as a size: write bytes, or a number with B, KB, MB, GB, KiB, MiB or GiB"
        )
    return int(float(match.group(1)) * _UNITS[match.group(2).lower()])


def parse_budget(value: int | float | str) -> int | float:
    """A memory budget as given: whole bytes (an int) or a fraction (a float in (0, 1]) of the no-remat peak.

    The one reading of budgets shared by `checkmate.compile` and the command line (`--budget`):

    * an int, a string of digits ("1000000") or a size ("8GiB", "512MiB", "1.5GB"): bytes;
    * a float, or a string with a decimal point or an exponent ("0.6", "1.0", "5e-1"): a fraction of the peak
      without rematerialization when it lies in (0, 1]. A string above 1 that is whole bytes ("1e9", "2048.0")
      is bytes; a float above 1 is refused (pass bytes as an int or a string).

    Raises:
        ValueError: for 0, negative budgets, a fraction above 1 that is not whole bytes, or text that is no budget.
    """
    if isinstance(value, bool):
        raise InvalidArgument(f"a budget must be {_BUDGET_FORMS}; got {value!r}")
    if isinstance(value, numbers.Integral):
        return _positive_bytes(int(value), value)
    if isinstance(value, float):
        if not math.isfinite(value) or value <= 0 or value > 1:
            raise InvalidArgument(
                f"a float budget is a fraction of the no-remat peak and must lie in (0, 1], got {value}: "
                "pass bytes as an int or a string such as '8GiB'"
            )
        return value
    if not isinstance(value, str):
        raise InvalidArgument(f"a budget must be {_BUDGET_FORMS}; got {type(value).__name__}")
    text = value.strip()
    if text.startswith("-"):
        raise InvalidArgument(f"a budget must be more than 0 bytes, got {value!r}")
    if _WHOLE.match(text):
        return _positive_bytes(int(text), value)
    if _NUMBER.match(text):
        number = float(text)
        if not math.isfinite(number) or number <= 0:
            raise InvalidArgument(f"a budget must be more than 0 bytes, got {value!r}")
        if number <= 1:
            return number
        if number.is_integer():
            return int(number)
        raise InvalidArgument(
            f"budget {value!r} is neither a fraction in (0, 1] of the no-remat peak nor a whole number of bytes; "
            f"write {_BUDGET_FORMS}"
        )
    try:
        size = parse_bytes(text)
    except ValueError:
        raise InvalidArgument(f"cannot read {value!r} as a budget: write {_BUDGET_FORMS}") from None
    return _positive_bytes(size, value)


def resolve_budget(value: int | float | str, no_remat_peak: int) -> int:
    """Bytes from a budget as `parse_budget` reads it: a fraction is that share of `no_remat_peak` (rounded down)."""
    budget = parse_budget(value)
    return int(budget * no_remat_peak) if isinstance(budget, float) else budget


def _positive_bytes(size: int, value: object) -> int:
    if size <= 0:
        raise InvalidArgument(f"a budget must be more than 0 bytes, got {value!r}")
    return size


def format_bytes(size: float) -> str:
    """Human-readable binary size, for example 1536 -> '1.50 KiB'."""
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if abs(size) >= scale:
            return f"{size / scale:.2f} {unit}"
    return f"{int(size)} B"
