"""Property tests: every registered heuristic returns a plan that simulates valid and within the budget, or refuses.

The MILP methods ("optimal", "approx") are covered by their own tests.
"""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from oracles import paper_cost_and_peak

from checkmate import Graph, InfeasibleBudget, MethodNotApplicable, check_plan, solve
from checkmate.examples import linear_graph, training_graph
from checkmate.strategies.registry import strategies

HEURISTICS = [
    strategy.name
    for strategy in strategies()
    if strategy.name not in ("optimal", "approx") and not strategy.needs_host_link
]
PROPERTY_SETTINGS = settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@st.composite
def branching_graphs(draw: st.DrawFn) -> Graph:
    """A forward DAG (each node reads its predecessor and maybe earlier ones) with its backward graph."""
    size = draw(st.integers(1, 9))
    forward_inputs: list[list[int]] = [[]]
    for node in range(1, size):
        skips = draw(st.lists(st.integers(0, node - 1), max_size=2))
        forward_inputs.append(sorted({node - 1, *skips}))
    costs = draw(st.lists(st.integers(1, 9), min_size=size, max_size=size))
    memory = draw(st.lists(st.integers(0, 9), min_size=size, max_size=size))
    fixed = draw(st.integers(0, 5))
    return training_graph(forward_inputs, costs=costs, memory=memory, fixed_memory=fixed)


def assert_valid_within(graph: Graph, method: str, budget: int | None) -> None:
    try:
        plan = solve(graph, budget, method=method)
    except InfeasibleBudget as error:
        assert budget is not None and error.budget == budget
        assert error.minimum is not None and error.minimum > budget
        return
    except MethodNotApplicable:
        assert method == "griewank", f"{method} refused a valid graph"
        return
    check_plan(graph, plan.R, plan.S)
    assert (plan.cost, plan.peak_memory) == pytest.approx(paper_cost_and_peak(graph, plan.R, plan.S))
    assert budget is None or plan.peak_memory <= budget
    assert plan.cost >= float(graph.costs.sum()) - 1e-9, "every node runs at least once"


@pytest.mark.parametrize("method", HEURISTICS)
@PROPERTY_SETTINGS
@given(graph=branching_graphs(), fraction=st.floats(0.0, 1.2))
def test_plans_on_branching_graphs_are_valid_and_within_budget(method: str, graph: Graph, fraction: float) -> None:
    reference = solve(graph, None, method="checkpoint_all").peak_memory
    assert_valid_within(graph, method, None)
    assert_valid_within(graph, method, int(fraction * reference))


@pytest.mark.parametrize("method", HEURISTICS)
@PROPERTY_SETTINGS
@given(n=st.integers(1, 24), fraction=st.floats(0.0, 1.2))
def test_plans_on_chains_are_valid_and_within_budget(method: str, n: int, fraction: float) -> None:
    graph = linear_graph(n)
    assert_valid_within(graph, method, int(fraction * (n + 2)))


@pytest.mark.parametrize("method", HEURISTICS)
@PROPERTY_SETTINGS
@given(graph=branching_graphs())
def test_a_plan_fits_its_own_peak(method: str, graph: Graph) -> None:
    try:
        plan = solve(graph, None, method=method)
    except MethodNotApplicable:
        assert method == "griewank"
        return
    assert solve(graph, plan.peak_memory, method=method).peak_memory <= plan.peak_memory
