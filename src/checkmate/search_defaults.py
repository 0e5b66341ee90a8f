"""How long a search looks, for `checkmate.compile` and `checkmate.backend` alike: the defaults of the methods that
search, and the clock that gives each solve what is left of a time limit shared by several solves."""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping
from typing import Any

from checkmate.strategies.registry import option_names

log = logging.getLogger(__name__)

DEFAULT_TIME_LIMIT = 120.0
TIMED_METHODS = ("optimal", "approx")
# `optimal` stops once its plan is proven within this fraction of its lower bound. Searching on rarely pays: the
# rest of the time limit seldom finds a better plan than one already this close (BENCHMARKS.md, "Time to the first
# step with every default").
DEFAULT_GAP = 0.01
# `optimal` also stops once its gap has not closed for this many seconds (`checkmate.strategies.stall`): on real
# captures the MILP often holds a gap of 1-5 % for the whole time limit without a better plan, and where it stalls
# it has its plan within 10 s (BENCHMARKS.md, "Large graphs", what the stall rule costs).
DEFAULT_STALL_TIME = 10.0


def with_search_defaults(method: str, options: Mapping[str, Any]) -> dict[str, Any]:
    """`options` with the defaults of a search where not given: `time_limit` DEFAULT_TIME_LIMIT for the
    TIMED_METHODS, so that a first call cannot hang, and `mip_gap` DEFAULT_GAP and `stall_time` DEFAULT_STALL_TIME
    for "optimal"."""
    defaults: dict[str, Any] = {}
    if method in TIMED_METHODS:
        defaults["time_limit"] = DEFAULT_TIME_LIMIT
    if method == "optimal":
        defaults["mip_gap"] = DEFAULT_GAP
        defaults["stall_time"] = DEFAULT_STALL_TIME
    return {**defaults, **options}


def within_time_left(method: str, options: Mapping[str, Any], limit: float, started: float) -> dict[str, Any]:
    """`options` for a solve starting now: its `time_limit` cut to what is left of `limit` seconds counted from
    `started` (a `time.perf_counter()`), or set to that when not given; unchanged for a method without a time limit."""
    if "time_limit" not in (option_names(method) or ()):
        return dict(options)
    left = max(0.0, limit - (time.perf_counter() - started))
    asked = options.get("time_limit")
    log.info("time left for the solve: %.1f s", left)
    return {**options, "time_limit": left if asked is None else min(asked, left)}
