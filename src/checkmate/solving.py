"""Solving a planning graph within a budget, the one way `checkmate.compile` and `checkmate.backend` both do it: from
the disk plan cache when possible (`checkmate.plan_cache`), each solve within what is left of the planning
time, the searches of one planning sharing one Ctrl-C and showing their work as the options say.

    started = time.perf_counter()
    with planning_scope(options):
        ...  # capture, compile and measure the nodes
        plan = cached_solve(graph, budget, method=method, options=options_within(method, options, limit, started),
                            cost_model=cost_model, device=device, cache=True)
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator, Mapping
from typing import Any

from checkmate import plan_cache, progress_lines
from checkmate.errors import InvalidArgument
from checkmate.graph import Graph
from checkmate.options import CostModel
from checkmate.plan import Plan
from checkmate.progress import interrupt_scope
from checkmate.search_defaults import within_time_left
from checkmate.solve import DISPLAY_OPTIONS, solve
from checkmate.strategies.held_start import HeldStart
from checkmate.strategies.registry import option_names


def check_planning_time_limit(planning_time_limit: float | None) -> None:
    """InvalidArgument for a planning time limit below 0 seconds (None: no limit)."""
    if planning_time_limit is not None and not planning_time_limit >= 0:
        raise InvalidArgument(f"planning_time_limit must be at least 0 seconds (or None), got {planning_time_limit}")


def options_within(
    method: str, options: Mapping[str, Any], planning_time_limit: float | None, started: float
) -> dict[str, Any]:
    """The method's options for a solve starting now: its `time_limit` cut to what is left of `planning_time_limit`
    seconds counted from `started` (a `time.perf_counter()`, when the planning began); the options as given when
    there is no planning time limit."""
    if planning_time_limit is None:
        return dict(options)
    return within_time_left(method, options, planning_time_limit, started)


@contextlib.contextmanager
def planning_scope(options: Mapping[str, Any]) -> Iterator[threading.Event]:
    """While inside: one Ctrl-C for all the searches (`checkmate.progress.interrupt_scope`: the event yielded is set
    once Ctrl-C stopped one, and the later ones answer at once with what they have), and the lines of long work
    before a search (profiling, measuring) shown unless the options say `progress`, every `progress_interval`
    seconds (`checkmate.progress_lines.shown`)."""
    with (
        interrupt_scope() as interrupted,
        progress_lines.shown(options.get("progress") is None, options.get("progress_interval")),
    ):
        yield interrupted


def cached_solve(
    graph: Graph,
    budget: int,
    *,
    method: str,
    options: Mapping[str, Any],
    cost_model: CostModel,
    device: str,
    cache: bool,
    extra_starts: Callable[[], tuple[HeldStart, ...]] = tuple,
) -> Plan:
    """The plan of `graph` within `budget` bytes by `method` with `options`: from the disk cache when `cache` and an
    entry serves these options, else solved (and cached when `cache`). The entry is keyed by the graph (without
    profiled costs when `cost_model` is "profile"), the budget, the method, its options (not those that only show
    progress) and `device` (`plan_cache.plan_key`). A search also starts from `extra_starts()` (the method must take
    that option), made only when it runs: the starts are a function of the graph and budget the key names, so they
    are not part of it, and a plan served from the cache costs no time making them.

    Raises:
        InfeasibleBudget: no plan of the method fits `budget` (never cached).
    """
    key = plan_cache.plan_key(
        graph,
        budget=budget,
        method=method,
        options={name: value for name, value in options.items() if name not in DISPLAY_OPTIONS},
        cost_model=cost_model,
        device=device,
    )

    def solved() -> Plan:
        starts = extra_starts()
        return solve(graph, budget, method=method, **options, **({"extra_starts": starts} if starts else {}))

    if not cache:
        return solved()
    searches = "time_limit" in (option_names(method) or ())
    with interrupt_scope() as interrupted:  # set once Ctrl-C stopped the search: its plan had less than its effort
        return plan_cache.cached_solve(
            key,
            graph,
            cost_model=cost_model,
            budget=budget,
            options=options,
            solve=solved,
            searches=searches,
            interrupted=interrupted.is_set,
        )
