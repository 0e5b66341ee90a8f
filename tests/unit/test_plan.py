import itertools

import numpy as np
import pytest
from oracles import random_valid_s

from checkmate import Graph, InvalidSchedule, Node, Plan, cheapest_r, check_plan, make_plan, simulate
from checkmate.examples import linear_graph, random_training_graph

BRANCH = Graph(
    (
        Node("a", 1.0, 2),
        Node("b", 2.0, 1, inputs=(0,)),
        Node("c", 3.0, 3, inputs=(0, 1)),
        Node("d", 1.0, 1, True, inputs=(1, 2)),
        Node("e", 2.0, 2, True, inputs=(0, 3)),
    )
)


@pytest.mark.parametrize("graph", [linear_graph(2), BRANCH], ids=["chain", "branch"])
def test_cheapest_r_is_the_cheapest_valid_r_by_exhaustive_search(graph: Graph) -> None:
    rng = np.random.default_rng(0)
    T = graph.size
    free_cells = [(t, i) for t in range(T) for i in range(t)]
    for _ in range(3):
        S = random_valid_s(graph, rng, 0.3)
        best = cheapest_r(graph, S)
        check_plan(graph, best, S)
        best_cost = simulate(graph, best, S)[0]
        for bits in itertools.product((False, True), repeat=len(free_cells)):
            R = np.eye(T, dtype=bool)
            for (t, i), bit in zip(free_cells, bits, strict=True):
                R[t, i] = bit
            try:
                check_plan(graph, R, S)
            except InvalidSchedule:
                continue
            assert simulate(graph, R, S)[0] >= best_cost
            assert (best <= R).all(), "every valid R contains the cheapest R"


def test_plan_json_round_trip() -> None:
    graph = random_training_graph(6, seed=4)
    S = random_valid_s(graph, np.random.default_rng(1))
    plan = make_plan(graph, cheapest_r(graph, S), S, method="test", budget=100, lower_bound=1.0)
    again = Plan.from_json(plan.to_json(), graph)
    assert np.array_equal(again.R, plan.R) and np.array_equal(again.S, plan.S)
    assert (again.cost, again.peak_memory, again.method, again.budget) == (plan.cost, plan.peak_memory, "test", 100)
    assert again.gap == pytest.approx((plan.cost - 1.0) / plan.cost)
