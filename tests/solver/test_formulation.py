"""The MILP encoding against the simulator: every valid plan is a feasible point with the same cost and peak."""

from __future__ import annotations

import numpy as np
import pytest
from oracles import with_workspace

from checkmate.examples import linear_graph, random_training_graph, training_graph
from checkmate.graph import Graph, Node
from checkmate.milp.formulation import decode, encode, encode_solution, moment_usage
from checkmate.milp.scaling import memory_scale, relaxed_scale
from checkmate.plan import cheapest_r
from checkmate.simulate import lower, simulate

GRAPHS = [
    linear_graph(5),
    random_training_graph(6, seed=3),
    training_graph([[], [0], [0, 1], [1, 2]], memory=[3, 1, 4, 2], fixed_memory=7),
    with_workspace(random_training_graph(6, seed=5), seed=5),
]


def _random_plans(graph: Graph, count: int, seed: int) -> list[tuple[np.ndarray, np.ndarray]]:
    rng = np.random.default_rng(seed)
    plans = []
    for density in np.linspace(0.0, 1.0, count):
        S = np.tril(rng.random((graph.size, graph.size)) < density, -1)
        plans.append((cheapest_r(graph, S), S))
    return plans


@pytest.mark.parametrize("graph", GRAPHS, ids=["chain", "random", "skip", "workspace"])
def test_valid_plans_are_feasible_points_with_the_simulated_cost_and_peak(graph: Graph) -> None:
    scale = memory_scale(graph)
    assert scale.exact and scale.unit == 1
    for R, S in _random_plans(graph, 12, seed=graph.size):
        full_cost, full_peak = simulate(graph, R, S)
        _, index = encode(graph, scale.budget_units(full_peak, graph.fixed_memory), scale)
        R_kept, S_kept = decode(encode_solution(graph, index, R, S), index)
        cost, peak = simulate(graph, R_kept, S_kept)  # dropping useless entries never costs or peaks more
        assert cost <= full_cost and peak <= full_peak
        problem, index = encode(graph, scale.budget_units(peak, graph.fixed_memory), scale)
        x = encode_solution(graph, index, R, S)
        assert problem.max_violation(x) < 1e-9
        assert problem.c @ x == pytest.approx(cost)
        tighter, _ = encode(graph, scale.budget_units(peak - 1, graph.fixed_memory), scale)
        assert tighter.max_violation(x) >= 1.0 - 1e-9


@pytest.mark.parametrize("graph", GRAPHS, ids=["chain", "random", "skip", "workspace"])
def test_moment_usage_is_the_simulated_usage_at_every_compute(graph: Graph) -> None:
    """The rows minimum_budget bounds its peak variable with: workspace included, the largest is the simulated peak."""
    scale = memory_scale(graph)
    _, index = encode(graph, np.inf, scale)
    for R, S in _random_plans(graph, 8, seed=graph.size + 1):
        R, S = decode(encode_solution(graph, index, R, S), index)
        usage = moment_usage(index) @ encode_solution(graph, index, R, S)
        simulated = np.array(lower(graph, R, S).usage) - graph.fixed_memory
        assert usage[index.U_col[R] - index.U_col[0, 0]].tolist() == pytest.approx(simulated.tolist())
        assert usage.max() == pytest.approx(simulated.max())


def test_no_variable_is_fixed_to_zero_and_sizes_are_triangular() -> None:
    graph = linear_graph(6)
    problem, index = encode(graph, 100.0, memory_scale(graph))
    assert np.all(problem.col_upper > 0)
    T = graph.size
    assert np.all(index.R_col[np.triu_indices(T, 1)] == -1)
    assert np.all(index.S_col[np.triu_indices(T, 0)] == -1)
    assert (index.R_col[np.arange(T), np.arange(T)] >= 0).all()
    assert problem.col_lower[index.R_col[np.arange(T), np.arange(T)]].min() == 1.0


def test_lossy_scaling_rounds_sizes_up_and_the_budget_down() -> None:
    nodes = (Node("a", 1.0, 1_000_003), Node("b", 1.0, 7, inputs=(0,)), Node("c", 1.0, 2_000_000, inputs=(0, 1)))
    graph = Graph(nodes, fixed_memory=5)
    scale = memory_scale(graph, resolution=100)
    assert not scale.exact
    assert np.all(scale.sizes * scale.unit >= graph.memory)
    budget = 3_000_000
    assert scale.budget_units(budget, 5) * scale.unit <= budget - 5
    assert np.all(relaxed_scale(scale, graph).sizes * scale.unit <= graph.memory)
