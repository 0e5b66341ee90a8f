"""The baseline plans the MILP starts from and falls back on."""

from __future__ import annotations

import logging

from checkmate.errors import InfeasibleBudget, MethodNotApplicable
from checkmate.graph import Graph
from checkmate.plan import Plan
from checkmate.strategies.registry import call_strategy, strategies
from checkmate.units import format_bytes

log = logging.getLogger(__name__)

BASELINES = ("checkpoint_all", "chen_sqrtn", "chen_greedy", "chen_sqrtn_linear", "chen_greedy_linear", "griewank")


def _registered_baselines() -> list[str]:
    registered = {strategy.name for strategy in strategies()}
    return [name for name in BASELINES if name in registered]


def _try_baseline(name: str, graph: Graph, budget: int | None) -> Plan | InfeasibleBudget | None:
    """The baseline's plan, its InfeasibleBudget, or None when it does not handle the graph's shape. Any other error
    (an invalid schedule is a bug in the baseline) propagates."""
    try:
        return call_strategy(name, graph, budget, {})
    except InfeasibleBudget as error:
        return error
    except MethodNotApplicable as error:
        log.debug("baseline %s does not apply: %s", name, error)
        return None


def best_baseline(graph: Graph, budget: int | None) -> Plan | None:
    """The cheapest registered baseline plan within `budget` (ties: lower peak), or None when none fits."""
    plans = [plan for name in _registered_baselines() if isinstance(plan := _try_baseline(name, graph, budget), Plan)]
    fitting = [plan for plan in plans if budget is None or plan.peak_memory <= budget]
    return min(fitting, key=lambda plan: (plan.cost, plan.peak_memory)) if fitting else None


def lowest_peak_baseline(graph: Graph) -> Plan | None:
    """The registered baseline plan with the lowest peak memory (each baseline asked for its own minimum)."""
    plans: list[Plan] = []
    for name in _registered_baselines():
        result = _try_baseline(name, graph, graph.fixed_memory)
        if isinstance(result, InfeasibleBudget) and result.minimum is not None:
            result = _try_baseline(name, graph, result.minimum)
        if isinstance(result, Plan):
            plans.append(result)
    return min(plans, key=lambda plan: (plan.peak_memory, plan.cost)) if plans else None


def unproven_infeasibility(graph: Graph, budget: int, found_nothing: str, advice: str) -> InfeasibleBudget:
    """The error of a search that found no plan within `budget` without proving that none exists: it says what found
    nothing and what to raise, and names the lowest baseline peak as a budget known to work (its `minimum`)."""
    known = lowest_peak_baseline(graph)
    works = "" if known is None else f"; {known.method} fits {format_bytes(known.peak_memory)} ({known.peak_memory} B)"
    return InfeasibleBudget(
        f"{found_nothing}; infeasibility is not proven. {advice}{works}",
        budget=budget,
        minimum=None if known is None else known.peak_memory,
    )
