"""Pieces shared by the strategies: plans from a fixed S, budget checks, the infeasibility error, the final plan."""

from __future__ import annotations

import time

import numpy as np

from checkmate.byte_sizes import format_bytes
from checkmate.errors import InfeasibleBudget
from checkmate.graph import Graph
from checkmate.plan import Plan, cheapest_fitting, cheapest_r, make_plan, proven_status


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
    best = cheapest_fitting(plans, budget)
    if best is None:
        assert budget is not None
        raise infeasible(method, budget, min(plan.peak_memory for plan in plans))
    return best


def final_plan(graph: Graph, budget: int, plan: Plan, *, bound: float | None, started: float, method: str) -> Plan:
    """The plan as a search returns it: its method, time since `started`, its proven lower `bound` (capped at its
    cost) and the status that bound gives it ("optimal" only when it meets the cost: `proven_status`)."""
    final = make_plan(
        graph,
        plan.R,
        plan.S,
        method=method,
        solve_time=time.perf_counter() - started,
        budget=budget,
        status=proven_status(plan.cost, bound),
        lower_bound=None if bound is None else min(bound, plan.cost),
        presence=plan.presence,
        moves=plan.moves,
    )
    assert final.peak_memory <= budget, "a plan must fit the budget it was made for"
    return final
