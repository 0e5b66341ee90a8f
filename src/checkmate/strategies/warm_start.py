"""The baseline plans the MILP starts from and falls back on."""

from __future__ import annotations

import logging
from collections.abc import Sequence

from checkmate.byte_sizes import format_bytes
from checkmate.errors import InfeasibleBudget, MethodNotApplicable
from checkmate.graph import Graph
from checkmate.plan import Plan, cheapest_fitting
from checkmate.progress import SearchControl
from checkmate.strategies.held_start import HeldStart, held_start_plan
from checkmate.strategies.registry import call_strategy, option_names, strategies_for

log = logging.getLogger(__name__)

BASELINES = (
    "checkpoint_all",
    "offload_all",
    "offload_only",
    "chen_sqrtn",
    "chen_greedy",
    "chen_sqrtn_linear",
    "chen_greedy_linear",
    "griewank",
)


def _registered_baselines(graph: Graph) -> list[str]:
    registered = {strategy.name for strategy in strategies_for(graph)}
    return [name for name in BASELINES if name in registered]


def _try_baseline(
    name: str, graph: Graph, budget: int | None, control: SearchControl | None
) -> Plan | InfeasibleBudget | None:
    """The baseline's plan, its InfeasibleBudget, or None when it does not handle the graph's shape. Any other error
    (an invalid schedule is a bug in the baseline) propagates. A baseline that takes a `control` (a search over
    candidates) is handed the caller's."""
    options = {"control": control} if control is not None and "control" in (option_names(name) or ()) else {}
    try:
        return call_strategy(name, graph, budget, options)
    except InfeasibleBudget as error:
        return error
    except MethodNotApplicable as error:
        log.debug("baseline %s does not apply: %s", name, error)
        return None


def best_baseline(
    graph: Graph, budget: int | None, control: SearchControl | None = None, starts: Sequence[HeldStart] = ()
) -> Plan | None:
    """The cheapest plan within `budget` (ties: lower peak) among the registered baselines and the `starts` given
    from outside the search (`checkmate.strategies.held_start`), or None when none fits; the baselines after
    `control` stops are not tried (on large graphs they take seconds), the starts always are."""
    plans: list[Plan] = []
    for name in _registered_baselines(graph):
        if control is not None and control.stopped:
            log.info("time is up: baselines from %s on not tried", name)
            break
        if isinstance(plan := _try_baseline(name, graph, budget, control), Plan):
            plans.append(plan)
    return cheapest_fitting([*plans, best_given(graph, budget, starts)], budget)


def best_given(graph: Graph, budget: int | None, starts: Sequence[HeldStart]) -> Plan | None:
    """The cheapest of the `starts` given from outside the search within `budget` (ties: lower peak), or None when
    none fits; how many fit is logged."""
    given = [held_start_plan(graph, start, method=start.label) for start in starts]
    fitting = cheapest_fitting(given, budget)
    if given:
        log.info(
            "%d of %d given starting plans fit the budget; the cheapest: %s",
            sum(budget is None or plan.peak_memory <= budget for plan in given),
            len(given),
            "none" if fitting is None else f"{fitting.method}, cost {fitting.cost:.6g}",
        )
    return fitting


def lowest_peak_baseline(graph: Graph, control: SearchControl | None = None) -> Plan | None:
    """The registered baseline plan with the lowest peak memory (each baseline asked for its own minimum); the
    baselines after `control` stops are not tried."""
    plans: list[Plan] = []
    for name in _registered_baselines(graph):
        if control is not None and control.stopped:
            break
        result = _try_baseline(name, graph, graph.fixed_memory, control)
        if isinstance(result, InfeasibleBudget) and result.minimum is not None:
            result = _try_baseline(name, graph, result.minimum, control)
        if isinstance(result, Plan):
            plans.append(result)
    return min(plans, key=lambda plan: (plan.peak_memory, plan.cost)) if plans else None


def unproven_infeasibility(
    graph: Graph, budget: int, found_nothing: str, advice: str, *, message_time: float
) -> InfeasibleBudget:
    """The error of a search that found no plan within `budget` without proving that none exists: it says what found
    nothing and what to raise, and names the lowest baseline peak found in `message_time` seconds as a budget known
    to work (its `minimum`)."""
    known = lowest_peak_baseline(graph, SearchControl(time_limit=message_time)) if message_time > 0 else None
    works = "" if known is None else f"; {known.method} fits {format_bytes(known.peak_memory)} ({known.peak_memory} B)"
    return InfeasibleBudget(
        f"{found_nothing}; infeasibility is not proven. {advice}{works}",
        budget=budget,
        minimum=None if known is None else known.peak_memory,
    )
