"""Pieces shared by the strategies: plans from a fixed S, budget checks, the infeasibility error."""

from __future__ import annotations

import numpy as np

from checkmate.errors import InfeasibleBudget
from checkmate.graph import Graph
from checkmate.plan import Plan, cheapest_r, make_plan
from checkmate.units import format_bytes

# The largest graph `optimal` solves as one MILP and `approx` rounds as one LP; larger ones go through a coarse
# graph (`checkmate.strategies.coarsened`). HiGHS proves chains of T = 129 in seconds and real graphs of 150 nodes
# within minutes (BENCHMARKS.md); at 339 nodes it no longer improves on its warm start in 15 minutes.
EXACT_NODES = 160


def plan_from_s(graph: Graph, S: np.ndarray, *, method: str) -> Plan:
    """Fix S, derive the cheapest R for it (paper Appendix B.1), and simulate."""
    return make_plan(graph, cheapest_r(graph, S), S, method=method)


def fits(plan: Plan, budget: int | None) -> bool:
    """True when the plan's simulated peak is within the budget (always, for no budget)."""
    return budget is None or plan.peak_memory <= budget


def infeasible(method: str, budget: int, minimum: int | None, *, hint: str = "") -> InfeasibleBudget:
    """The error for a budget below what `method` can meet, naming the smallest budget it could."""
    if minimum is None:
        message = f"{method} finds no plan within {format_bytes(budget)} ({budget} bytes)"
    else:
        message = (
            f"{method} needs at least {format_bytes(minimum)} ({minimum} bytes); the budget is "
            f"{format_bytes(budget)} ({budget} bytes). Raise the budget or try method='optimal'"
        )
    return InfeasibleBudget(message + (f". {hint}" if hint else ""), budget=budget, minimum=minimum)


def cheapest_within(plans: list[Plan], budget: int | None, *, method: str) -> Plan:
    """The cheapest plan within the budget (ties: lower peak); InfeasibleBudget naming the lowest peak otherwise."""
    if not plans:
        raise RuntimeError(f"internal: {method} produced no candidate plans; please report the graph")
    within = [plan for plan in plans if fits(plan, budget)]
    if not within:
        assert budget is not None
        raise infeasible(method, budget, min(plan.peak_memory for plan in plans))
    return min(within, key=lambda plan: (plan.cost, plan.peak_memory))
