"""Each installed backend on the raw MILP (no LP-first shortcut, no baselines): optimum, warm start, infeasibility."""

from __future__ import annotations

import time

import numpy as np
import pytest
from exhaustive import cheapest_at, cost_peak_frontier

from checkmate.examples import linear_graph, random_training_graph
from checkmate.milp.backends import available_backends, get_backend
from checkmate.milp.formulation import decode, encode, encode_solution
from checkmate.milp.problem import SolveOptions, SolveStatus
from checkmate.milp.scaling import memory_scale
from checkmate.plan import cheapest_r
from checkmate.simulate import simulate

BACKENDS = [name for name in ("highs", "scip", "gurobi", "portfolio") if name in available_backends()]
GRAPHS = {"chain2": linear_graph(2), "random2": random_training_graph(2, seed=7, max_memory=6)}


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("name", list(GRAPHS))
def test_backend_finds_the_exhaustive_optimum(backend: str, name: str) -> None:
    graph = GRAPHS[name]
    frontier = cost_peak_frontier(graph)
    scale = memory_scale(graph)
    for budget in range(frontier[0][0], frontier[-1][0] + 1):
        problem, index = encode(graph, scale.budget_units(budget, graph.fixed_memory), scale)
        solution = get_backend(backend).solve(problem, SolveOptions(time_limit=20))
        assert solution.status is SolveStatus.OPTIMAL and solution.x is not None
        R, S = decode(solution.x, index)
        cost, peak = simulate(graph, R, S)
        assert peak <= budget
        assert cost == pytest.approx(cheapest_at(frontier, budget))
        assert solution.objective == pytest.approx(cost)
        assert solution.bound is not None and solution.bound <= cost + 1e-6


@pytest.mark.parametrize("backend", BACKENDS)
def test_backend_reports_infeasibility_as_a_status(backend: str) -> None:
    graph = GRAPHS["chain2"]
    scale = memory_scale(graph)
    problem, _ = encode(graph, scale.budget_units(2, 0), scale)
    solution = get_backend(backend).solve(problem, SolveOptions(time_limit=20))
    assert solution.status is SolveStatus.INFEASIBLE and solution.x is None


@pytest.mark.parametrize("backend", BACKENDS)
def test_time_limited_backend_keeps_the_warm_start(backend: str) -> None:
    graph = linear_graph(24)
    S = np.zeros((graph.size, graph.size), dtype=bool)  # no checkpoints: every stage recomputes from the input
    R = cheapest_r(graph, S)
    cost, peak = simulate(graph, R, S)
    scale = memory_scale(graph)
    problem, index = encode(graph, scale.budget_units(peak, 0), scale)
    start = encode_solution(graph, index, R, S)
    solution = get_backend(backend).solve(problem, SolveOptions(time_limit=1.0), start)
    assert solution.x is not None and solution.objective is not None
    assert solution.objective <= cost + 1e-6
    assert simulate(graph, *decode(solution.x, index))[1] <= peak


def test_the_portfolio_stops_the_other_solver_once_one_proves_optimality() -> None:
    """At the no-remat budget the LP is tight and one solver proves it at once; the other, asked to stop, must not
    run on to the time limit."""
    if "portfolio" not in available_backends():
        pytest.skip("needs HiGHS and SCIP")
    graph = linear_graph(32)
    scale = memory_scale(graph)
    problem, _ = encode(graph, scale.budget_units(34, 0), scale)
    started = time.perf_counter()
    solution = get_backend("portfolio").solve(problem, SolveOptions(time_limit=60, should_stop=lambda: False))
    assert solution.status is SolveStatus.OPTIMAL
    assert time.perf_counter() - started < 30
