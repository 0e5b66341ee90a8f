"""`checkmate.solve`: the one entry point for every strategy."""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import numbers
import time
from collections.abc import Mapping
from typing import Any

from checkmate import strategies as _strategies  # noqa: F401  (registers the built-in methods)
from checkmate.byte_sizes import format_bytes, parse_budget, parse_bytes, resolve_budget
from checkmate.errors import InfeasibleBudget, InvalidArgument, InvalidSchedule
from checkmate.graph import Graph
from checkmate.plan import Plan
from checkmate.progress import SearchControl, stop_on_interrupt
from checkmate.progress_lines import INTERVAL, progress_lines
from checkmate.strategies.checkpoint_all import checkpoint_all
from checkmate.strategies.feasibility import in_fraction_of_peak
from checkmate.strategies.hold_fetched import hold_fetched
from checkmate.strategies.registry import call_strategy, check_options, option_names

log = logging.getLogger(__name__)

# Taken by `solve` for a method that searches: its SearchControl's limit and callback, and the progress lines.
SEARCH_OPTIONS = ("time_limit", "progress", "progress_interval")
# Options that change what a search shows, never its plan.
DISPLAY_OPTIONS = ("progress", "progress_interval")


def check_solve_options(method: str, options: Mapping[str, Any]) -> None:
    """InvalidArgument for what `solve(graph, budget, method=method, **options)` would refuse in its method or options
    (an unknown method, an option it does not take, a value it refuses such as an unknown solver), before any work."""
    for name in ("time_limit", "mip_gap"):
        value = options.get(name)
        if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float)) or not value >= 0):
            raise InvalidArgument(f"{name} must be a number >= 0 (or None), got {value!r}")
    progress = options.get("progress")
    if not (progress is None or progress is False or callable(progress)):
        raise InvalidArgument(f"progress must be a callable, False or None, got {progress!r}")
    interval = options.get("progress_interval", INTERVAL)
    if isinstance(interval, bool) or not isinstance(interval, (int, float)) or not interval > 0:
        raise InvalidArgument(f"progress_interval must be a number of seconds > 0, got {interval!r}")
    check_options(method, _method_options(method, options))


def _method_options(method: str, options: Mapping[str, Any]) -> dict[str, Any]:
    """`options` less those `solve` takes itself: SEARCH_OPTIONS for a method that searches, DISPLAY_OPTIONS (which
    show nothing for a method that does not search) for the others."""
    taken = SEARCH_OPTIONS if _searches(method) and "control" not in options else DISPLAY_OPTIONS
    return {name: value for name, value in options.items() if name not in taken}


def _searches(method: str) -> bool:
    """Whether `method` takes a SearchControl, which `solve` makes from the SEARCH_OPTIONS it is given."""
    return "control" in (option_names(method) or ())


def solve(graph: Graph, budget: int | float | str | None, *, method: str = "checkpoint_all", **options: Any) -> Plan:
    """Plan the training step `graph` within `budget` bytes using `method`.

    Args:
        graph: the training graph.
        budget: bytes (an int, or a string such as "512MiB" or "1.5GB"), or a float in (0, 1]: that fraction of the
            peak with no recomputation (`checkmate.byte_sizes.parse_budget`, as `checkmate.compile` reads it); fixed
            memory included; None for no limit.
        method: a name from `checkmate methods` (for example "checkpoint_all", "chen_greedy", "optimal").
        **options: options of that method. A method that searches (optimal, approx) takes `time_limit`, the
            seconds for the whole call, and `progress`: a callback given `checkmate.progress.Progress` snapshots;
            None (the default) for a line every `progress_interval` seconds (5) on stderr, or in the log when
            logging is configured (`checkmate.progress_lines`); False for neither. While it runs in the main
            thread, Ctrl-C stops the search and the best plan so far is returned.

    Returns:
        A Plan whose simulated peak is within the budget. A graph's fetched values are held across the gaps between
        their uses where the budget has room (`checkmate.strategies.hold_fetched`), whatever the method.

    Raises:
        InvalidArgument: an unknown method or option, a budget that is none, or a negative or NaN limit.
        InfeasibleBudget: no plan of that method fits; the error's `minimum` is the smallest budget it could meet.
        InvalidSchedule: the method returned a plan over the budget (a bug of the method, never a budget's fault).
    """
    check_solve_options(method, options)
    fraction, no_remat_peak, budget_bytes = _budget_bytes(graph, budget)
    started = time.perf_counter()
    try:
        plan = _planned(graph, budget_bytes, method, options)
    except InfeasibleBudget as error:
        if fraction is None:
            raise
        raise in_fraction_of_peak(error, fraction, no_remat_peak) from None
    if budget_bytes is not None and graph.fetched and plan.peak_memory <= budget_bytes:
        plan = hold_fetched(graph, plan, budget_bytes)
    elapsed = time.perf_counter() - started
    if budget_bytes is not None and plan.peak_memory > budget_bytes:
        # Every strategy raises InfeasibleBudget itself when it cannot fit; a plan over the budget is a bug, and
        # reporting it as "does not fit" would hide it in sweeps, comparisons and max batch.
        raise InvalidSchedule(
            f"internal error: {method} returned a plan with peak {format_bytes(plan.peak_memory)} over the budget "
            f"{format_bytes(budget_bytes)} instead of raising InfeasibleBudget; please report the graph and budget"
        )
    log.info("%s: cost %.6g, peak %s, %.3f s", method, plan.cost, format_bytes(plan.peak_memory), elapsed)
    return dataclasses.replace(plan, solve_time=elapsed, budget=budget_bytes)


def _planned(graph: Graph, budget_bytes: int | None, method: str, options: dict[str, Any]) -> Plan:
    """The method's plan; a method that searches gets a SearchControl, Ctrl-C handling and progress lines."""
    if _searches(method) and "control" not in options:
        progress = options.pop("progress", None)
        interval = options.pop("progress_interval", INTERVAL)
        control = SearchControl(time_limit=options.pop("time_limit", None), callback=progress or None)
        lines = progress_lines(control, graph.least_cost, interval=interval) if progress is None else None
        with stop_on_interrupt(control), lines or contextlib.nullcontext():
            return call_strategy(method, graph, budget_bytes, {**options, "control": control})
    return call_strategy(method, graph, budget_bytes, _method_options(method, options))


def _budget_bytes(graph: Graph, budget: int | float | str | None) -> tuple[float | None, int, int | None]:
    """A budget as `checkmate.compile` reads it: (the fraction given or None, the peak it is a fraction of (0 when
    none was given), bytes or None for no limit)."""
    if budget is None:
        return None, 0, None
    if isinstance(budget, numbers.Integral) and not isinstance(budget, bool):
        return None, 0, parse_bytes(int(budget))
    resolved = parse_budget(budget)
    if isinstance(resolved, int):
        return None, 0, resolved
    peak = checkpoint_all(graph, None).peak_memory
    return resolved, peak, resolve_budget(resolved, peak)
