"""approx: within budget, at or above the LP bound, never below optimal; reproducible by seed."""

from __future__ import annotations

import pytest

import checkmate
from checkmate.examples import linear_graph, random_training_graph
from checkmate.simulate import simulate

CASES = [(linear_graph(8), budget) for budget in (3, 5, 6, 9)] + [
    (random_training_graph(6, seed=1), budget) for budget in (0.8, 0.9, 1.0)
]


@pytest.mark.parametrize(("graph", "budget"), CASES)
def test_approx_is_within_budget_above_the_lp_bound_and_not_below_optimal(
    graph: checkmate.Graph, budget: float
) -> None:
    if isinstance(budget, float):
        peak = checkmate.solve(graph, None, method="checkpoint_all").peak_memory
        budget = max(int(budget * peak), checkmate.minimum_budget(graph, time_limit=10).upper or peak)
    plan = checkmate.solve(graph, budget, method="approx", time_limit=20)
    best = checkmate.solve(graph, budget, method="optimal", time_limit=20)
    assert plan.peak_memory <= budget
    assert simulate(graph, plan.R, plan.S) == (plan.cost, plan.peak_memory)
    assert plan.lower_bound is not None and plan.lower_bound <= plan.cost + 1e-9
    assert plan.lower_bound == pytest.approx(checkmate.lower_bound(graph, budget))
    assert plan.cost >= best.cost - 1e-9
    assert plan.status == ("optimal" if plan.cost <= plan.lower_bound + 1e-9 else "feasible")


def test_approx_is_reproducible_for_a_seed() -> None:
    graph = random_training_graph(8, seed=5)
    budget = int(0.7 * checkmate.solve(graph, None, method="checkpoint_all").peak_memory)
    first = checkmate.solve(graph, budget, method="approx", seed=3, time_limit=20)
    second = checkmate.solve(graph, budget, method="approx", seed=3, time_limit=20)
    assert (first.R == second.R).all() and (first.S == second.S).all()


def test_approx_below_any_schedule_names_the_minimum() -> None:
    with pytest.raises(checkmate.InfeasibleBudget) as caught:
        checkmate.solve(linear_graph(8), 2, method="approx")
    assert caught.value.minimum == 3
