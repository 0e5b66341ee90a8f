"""optimal against an independent exhaustive search (the paper's equations), and under a time limit."""

from __future__ import annotations

import functools

import pytest
from exhaustive import cheapest_at, cost_peak_frontier, meets_constraints
from oracles import paper_cost_and_peak, with_retained, with_workspace

import checkmate
from checkmate.examples import linear_graph, random_training_graph, training_graph
from checkmate.graph import Graph
from checkmate.milp.backends import available_backends
from checkmate.strategies.warm_start import best_baseline

SMALL = {
    "chain2": linear_graph(2),
    "random2": random_training_graph(2, seed=4, max_memory=5),
    "skip3": training_graph([[], [0], [0, 1]], costs=[2.0, 1.0, 3.0], memory=[2, 3, 1], fixed_memory=4),
    "workspace3": with_workspace(
        training_graph([[], [0], [0, 1]], costs=[2.0, 1.0, 3.0], memory=[2, 3, 1], fixed_memory=4), seed=5
    ),
    "retained2": with_retained(with_workspace(random_training_graph(2, seed=4, max_memory=5), seed=6), seed=6),
}
BACKENDS = [name for name in ("highs", "scip") if name in available_backends()]


@functools.cache
def _frontier(name: str) -> list[tuple[int, float]]:
    return cost_peak_frontier(SMALL[name])


def _check(plan: checkmate.Plan, graph: Graph, budget: int) -> None:
    """Within budget and valid by the paper's constraints, with the cost and peak its equations give."""
    assert plan.peak_memory <= budget
    assert meets_constraints(graph, plan.R, plan.S)
    cost, peak = paper_cost_and_peak(graph, plan.R, plan.S)
    assert (plan.cost, plan.peak_memory) == (pytest.approx(cost), peak)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("name", list(SMALL))
def test_optimal_equals_exhaustive_search_at_every_budget(name: str, backend: str) -> None:
    graph = SMALL[name]
    frontier = _frontier(name)
    lowest, highest = frontier[0][0], frontier[-1][0]
    for budget in range(lowest, highest + 2):
        plan = checkmate.solve(graph, budget, method="optimal", backend=backend, time_limit=20)
        _check(plan, graph, budget)
        assert plan.cost == pytest.approx(cheapest_at(frontier, budget))
        assert plan.status == "optimal"
        assert plan.lower_bound == pytest.approx(plan.cost, rel=1e-4)


@pytest.mark.parametrize("name", list(SMALL))
def test_budget_below_any_schedule_names_the_exact_minimum(name: str) -> None:
    graph = SMALL[name]
    lowest = _frontier(name)[0][0]
    for budget in (lowest - 1, graph.fixed_memory):
        with pytest.raises(checkmate.InfeasibleBudget) as caught:
            checkmate.solve(graph, budget, method="optimal", time_limit=20)
        assert caught.value.minimum == lowest
        assert str(lowest) in str(caught.value)


@pytest.mark.parametrize("name", list(SMALL))
def test_lp_bound_never_exceeds_the_optimum(name: str) -> None:
    graph = SMALL[name]
    frontier = _frontier(name)
    for peak, cost in frontier:
        assert checkmate.lower_bound(graph, peak, time_limit=20) <= cost + 1e-6
    with pytest.raises(checkmate.InfeasibleBudget):
        checkmate.lower_bound(graph, frontier[0][0] - 1)


def test_no_budget_means_checkpoint_all() -> None:
    graph = SMALL["random2"]
    plan = checkmate.solve(graph, None, method="optimal")
    assert plan.cost == pytest.approx(graph.costs.sum())
    assert plan.status == "optimal"


RANDOM_WITH_WORKSPACE = [with_workspace(random_training_graph(2, seed=seed), seed=seed) for seed in (11, 21, 31)]
RANDOM_WITH_WORKSPACE.append(with_retained(RANDOM_WITH_WORKSPACE[0], seed=11))


@pytest.mark.parametrize("graph", RANDOM_WITH_WORKSPACE, ids=["seed11", "seed21", "seed31", "seed11-retained"])
def test_optimal_equals_the_independent_optimum_on_random_graphs_with_workspaces(graph: Graph) -> None:
    """Against the exhaustive search priced by the paper's equations (not against the baselines, which `optimal`
    is only guaranteed to match because it starts from them)."""
    frontier = cost_peak_frontier(graph)
    for budget in range(frontier[0][0], frontier[-1][0] + 2):
        plan = checkmate.solve(graph, budget, method="optimal", time_limit=20)
        _check(plan, graph, budget)
        assert plan.cost == pytest.approx(cheapest_at(frontier, budget)), budget


@pytest.mark.slow
def test_time_limited_solve_on_130_stages_is_no_worse_than_the_best_baseline() -> None:
    graph = linear_graph(64)
    budget = checkmate.solve(graph, None, method="chen_sqrtn").peak_memory
    plan = checkmate.solve(graph, budget, method="optimal", time_limit=3)
    baseline = best_baseline(graph, budget)
    assert baseline is not None
    _check(plan, graph, budget)
    assert plan.cost <= baseline.cost
    assert plan.lower_bound is not None and plan.lower_bound <= plan.cost
    if plan.status != "optimal":
        assert plan.gap is not None and plan.gap > 0


def test_a_solve_that_finds_nothing_names_the_budget_a_baseline_meets(monkeypatch: pytest.MonkeyPatch) -> None:
    """When the MILP stops without a plan and no starting plan fits, the error gives the lowest baseline peak."""
    from checkmate.milp.problem import MilpSolution, SolveStatus
    from checkmate.strategies import milp_search

    class NothingInTime:
        """A MILP backend that always runs out of time before finding a plan (the LP is solved for real)."""

        def __init__(self, real):
            self.real = real

        def solve(self, problem, options, start=None):
            if problem.integer.any():
                return MilpSolution(SolveStatus.NO_SOLUTION, None, None, None, 0.0, "nothing-in-time")
            return self.real.solve(problem, options, start)

    from checkmate.strategies.starts import Starts

    real_backend = milp_search.milp_backend
    monkeypatch.setattr(milp_search, "milp_backend", lambda *args: NothingInTime(real_backend(*args)))
    monkeypatch.setattr(milp_search, "starting_plans", lambda graph, *args, **kwargs: Starts(None, graph.costs.sum()))
    monkeypatch.setattr(milp_search, "_rounded", lambda *args: None)
    graph = random_training_graph(8, seed=4)  # smallest budget 66; the lowest baseline peak, chen_sqrtn_linear: 78
    with pytest.raises(checkmate.InfeasibleBudget, match=r"not proven.*chen_sqrtn_linear fits") as caught:
        checkmate.solve(graph, 70, method="optimal", time_limit=5)
    assert caught.value.minimum == 78


def test_a_baseline_that_builds_an_invalid_schedule_is_a_bug_not_a_skipped_start(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """`InvalidSchedule` is a ValueError; the starting plans once caught every ValueError and skipped the baseline
    as if it did not fit. Only InfeasibleBudget and MethodNotApplicable mean "no start from this one"."""
    from checkmate.strategies import warm_start

    assert best_baseline(random_training_graph(4, seed=1), None) is not None, "griewank (not a chain) is skipped"
    real = warm_start.call_strategy

    def broken_chen(name, graph, budget, options):
        if name == "chen_sqrtn":
            raise checkmate.InvalidSchedule("S[3, 1] is held but was never computed (1c)")
        return real(name, graph, budget, options)

    monkeypatch.setattr(warm_start, "call_strategy", broken_chen)
    graph = linear_graph(6)
    with pytest.raises(checkmate.InvalidSchedule, match=r"\(1c\)"):
        best_baseline(graph, None)
    with pytest.raises(checkmate.InvalidSchedule):
        checkmate.solve(graph, 7, method="optimal", time_limit=5)  # one below the no-recomputation peak (8)
