"""`Node.recompute_cost` in the graph file, the plan cache's key and the simulator's price of a plan."""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest
from oracles import paper_cost_and_peak, random_valid_s, with_recompute_costs

from checkmate import plan_cache
from checkmate.errors import InvalidGraph
from checkmate.examples import linear_graph, random_training_graph
from checkmate.graph import Graph
from checkmate.options import CostModel
from checkmate.plan import cheapest_r
from checkmate.simulate import plan_cost, simulate


def _priced(graph: Graph, node: int, recompute_cost: float | None) -> Graph:
    nodes = list(graph.nodes)
    nodes[node] = dataclasses.replace(nodes[node], recompute_cost=recompute_cost)
    return dataclasses.replace(graph, nodes=tuple(nodes))


def test_the_graph_file_keeps_a_recompute_cost_and_writes_it_only_when_set() -> None:
    graph = _priced(_priced(linear_graph(2), 0, 0.25), 1, 0.0)
    again = Graph.from_json(graph.to_json())
    assert again == graph
    assert again.recompute_costs.tolist() == [0.25, 0.0, *graph.costs[2:].tolist()]
    entries = json.loads(graph.to_json())["nodes"]
    assert [entry.get("recompute_cost") for entry in entries] == [0.25, 0.0, None, None, None]
    assert all("recompute_cost" not in entry for entry in json.loads(linear_graph(2).to_json())["nodes"])


def test_a_file_without_recompute_costs_reads_as_none() -> None:
    text = json.dumps({"nodes": [{"name": "a", "cost": 2.0, "memory": 1}, {"name": "b", "cost": 1, "memory": 1}]})
    graph = Graph.from_json(text)
    assert [node.recompute_cost for node in graph.nodes] == [None, None]
    assert graph.recompute_costs.tolist() == [2.0, 1.0]


@pytest.mark.parametrize("value", [-1.0, float("nan"), "fast", True])
def test_a_bad_recompute_cost_in_a_file_is_refused(value: object) -> None:
    entry = {"name": "a", "cost": 1.0, "memory": 1, "recompute_cost": value}
    with pytest.raises(InvalidGraph, match="recompute_cost"):
        Graph.from_json(json.dumps({"nodes": [entry]}))


@pytest.mark.parametrize("cost_model", ["unit", "flops"])
def test_the_plan_cache_key_changes_with_a_recompute_cost(cost_model: CostModel) -> None:
    graph = linear_graph(3)

    def key(graph: Graph) -> str:
        return plan_cache.plan_key(graph, budget=10, method="optimal", options={}, cost_model=cost_model, device="cpu")

    keys = {key(graph), key(_priced(graph, 1, 0.5)), key(_priced(graph, 1, 0.25)), key(_priced(graph, 2, 0.5))}
    assert len(keys) == 4


def test_a_profiled_recompute_cost_is_keyed_by_its_presence() -> None:
    """Profiled timings vary from run to run and are left out of the key (as the costs are); whether a node is
    priced apart is not a timing, and stays in."""
    graph = linear_graph(3)

    def fingerprint(graph: Graph) -> str:
        return plan_cache.graph_fingerprint(graph, cost_model="profile")

    assert fingerprint(_priced(graph, 1, 0.5)) == fingerprint(_priced(graph, 1, 0.25))
    assert fingerprint(_priced(graph, 1, 0.5)) != fingerprint(graph)


def test_a_plan_costs_its_first_runs_at_cost_and_its_recomputations_at_recompute_cost() -> None:
    graph = _priced(linear_graph(2), 0, 0.25)  # forward_0 (cost 1), forward_1, loss, backward_1, backward_0
    S = np.zeros((graph.size, graph.size), dtype=bool)  # nothing held: every stage rebuilds from the input
    R = cheapest_r(graph, S)
    first_runs = float(graph.costs.sum())
    recomputed = R.sum(axis=0) - 1
    expected = first_runs + 0.25 * recomputed[0] + float(graph.costs[1:] @ recomputed[1:])
    assert simulate(graph, R, S)[0] == pytest.approx(expected)
    assert recomputed[0] == 4  # forward_0 runs again in each of the 4 later stages
    assert plan_cost(graph, R) == pytest.approx(paper_cost_and_peak(graph, R, S)[0])


@pytest.mark.parametrize("seed", range(6))
def test_the_simulated_cost_is_the_equations_cost(seed: int) -> None:
    graph = with_recompute_costs(random_training_graph(6, seed=seed), seed=seed)
    S = random_valid_s(graph, np.random.default_rng(seed))
    R = cheapest_r(graph, S)
    assert simulate(graph, R, S)[0] == pytest.approx(paper_cost_and_peak(graph, R, S)[0])


def test_without_recompute_costs_the_price_is_the_per_node_price_exactly() -> None:
    graph = random_training_graph(9, seed=5)
    S = random_valid_s(graph, np.random.default_rng(5))
    R = cheapest_r(graph, S)
    assert plan_cost(graph, R) == float(graph.costs @ R.sum(axis=0))
