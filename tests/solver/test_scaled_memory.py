"""Memory in solver units when sizes do not divide evenly: rounded plans still fit the budget in bytes.

With a coarse `memory_resolution` every size is rounded up to whole units and the budget down, so the MILP solves a
slightly tighter problem: its plans must fit in bytes (checked with the paper's equations), cost no less than the
exhaustive optimum in bytes, and never claim a proof that holds only in units.
"""

from __future__ import annotations

import dataclasses

import pytest
from exhaustive import cheapest_at, cost_peak_frontier, meets_constraints
from oracles import paper_cost_and_peak

import checkmate
from checkmate.examples import linear_graph
from checkmate.graph import Graph
from checkmate.milp.backends import get_backend
from checkmate.milp.formulation import decode, encode
from checkmate.milp.problem import SolveOptions
from checkmate.milp.scaling import memory_scale

PRIMES = (1009, 997, 2003, 1499, 2999, 1201, 1801, 907, 3001)


def _uneven() -> Graph:
    """A 3-layer chain (its frontier has three costs) with prime sizes and small workspaces."""
    nodes = tuple(
        dataclasses.replace(node, memory=PRIMES[(3 * index + 1) % len(PRIMES)], workspace=(index * 37) % 101)
        for index, node in enumerate(linear_graph(3).nodes)
    )
    return Graph(nodes, fixed_memory=4093)


UNEVEN = _uneven()
# Sizes one byte over whole thousands: with a unit of 1001 bytes rounding up adds almost nothing, so a budget
# rounded the wrong way would admit plans over it in bytes.
NEAR_WHOLE = Graph(
    tuple(
        dataclasses.replace(node, memory=(1001, 2001, 3001)[index % 3], workspace=0)
        for index, node in enumerate(linear_graph(3).nodes)
    ),
    fixed_memory=4093,
)


@pytest.mark.parametrize("method", ["optimal", "approx"])
def test_rounded_units_give_plans_that_fit_in_bytes(method: str) -> None:
    graph = UNEVEN
    assert not memory_scale(graph, resolution=8).exact, "the test needs sizes that do not divide evenly"
    frontier = cost_peak_frontier(graph)
    lowest, highest = frontier[0][0], frontier[-1][0]
    budgets = sorted({peak for peak, _ in frontier} | set(range(lowest, highest + 400, 200)))
    found = 0
    for budget in budgets:
        try:
            plan = checkmate.solve(graph, budget, method=method, memory_resolution=8, time_limit=20)
        except checkmate.InfeasibleBudget:
            continue  # rounding up may lose the tightest budgets; the plans found are what is checked
        found += 1
        assert meets_constraints(graph, plan.R, plan.S)
        cost, peak = paper_cost_and_peak(graph, plan.R, plan.S)
        assert (plan.cost, plan.peak_memory) == (pytest.approx(cost), peak)
        assert peak <= budget, f"{method} at {budget} bytes peaks at {peak}"
        optimum = cheapest_at(frontier, budget)
        assert optimum is not None and cost >= optimum - 1e-9
        if plan.status == "optimal":
            assert cost == pytest.approx(optimum), "a plan called optimal must be optimal in bytes"
    assert found >= len(budgets) // 2, "most budgets should still be met after rounding"


def test_an_exact_resolution_finds_the_byte_optimum() -> None:
    graph = UNEVEN
    frontier = cost_peak_frontier(graph)
    middle = (frontier[0][0] + frontier[-1][0]) // 2
    plan = checkmate.solve(graph, middle, method="optimal", memory_resolution=10**6, time_limit=20)
    assert memory_scale(graph, resolution=10**6).exact
    assert plan.cost == pytest.approx(cheapest_at(frontier, middle)) and plan.status == "optimal"


@pytest.mark.parametrize(("name", "resolution"), [("uneven", 8), ("uneven", 16), ("near_whole", 3)])
def test_the_milp_s_own_answer_fits_in_bytes_before_any_check(name: str, resolution: int) -> None:
    """The model in rounded units, solved and decoded with nothing after it to catch a plan over budget: sizes
    rounded up and the budget down must make every feasible point fit in bytes (`optimal` also re-checks)."""
    graph = {"uneven": UNEVEN, "near_whole": NEAR_WHOLE}[name]
    scale = memory_scale(graph, resolution)
    assert not scale.exact
    frontier = cost_peak_frontier(graph)
    solved = 0
    for budget in range(frontier[0][0] - 1000, frontier[-1][0] + 400, 97):
        problem, index = encode(graph, scale.budget_units(budget, graph.fixed_memory), scale)
        solution = get_backend("highs").solve(problem, SolveOptions(time_limit=20))
        if solution.x is None:
            continue
        solved += 1
        R, S = decode(solution.x, index)
        assert meets_constraints(graph, R, S)
        assert paper_cost_and_peak(graph, R, S)[1] <= budget, f"{budget} bytes at resolution {resolution}"
    assert solved >= 5
