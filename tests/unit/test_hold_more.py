"""hold_more and swap_holds: local search on the full graph, checked with the paper's equations."""

from __future__ import annotations

import pytest
from oracles import paper_cost_and_peak, with_workspace

import checkmate
from checkmate.examples import linear_graph, random_training_graph
from checkmate.progress import SearchControl
from checkmate.strategies.hold_more import hold_more, swap_holds


def _within(plan: checkmate.Plan, graph: checkmate.Graph, budget: int) -> tuple[float, int]:
    cost, peak = paper_cost_and_peak(graph, plan.R, plan.S)
    assert peak <= budget
    return cost, peak


@pytest.mark.parametrize("seed", range(5))
def test_hold_more_spends_spare_memory_and_never_makes_a_plan_worse(seed: int) -> None:
    graph = with_workspace(random_training_graph(12, seed=seed), seed=seed)
    start = checkmate.solve(graph, None, method="chen_sqrtn_linear")
    budget = checkmate.solve(graph, None).peak_memory  # room to hold everything: the search must find it
    improved = hold_more(graph, start, budget, SearchControl(time_limit=30), method="hold_more")
    cost, _ = _within(improved, graph, budget)
    assert cost <= start.cost
    assert cost == pytest.approx(graph.costs.sum())


def test_hold_more_on_a_chain_at_a_tight_budget_stays_within_it() -> None:
    graph = linear_graph(16)
    budget = checkmate.solve(graph, None, method="chen_sqrtn").peak_memory + 2
    start = checkmate.solve(graph, budget, method="chen_sqrtn")
    improved = hold_more(graph, start, budget, SearchControl(time_limit=30), method="hold_more")
    cost, _ = _within(improved, graph, budget)
    assert cost < start.cost  # two spare units remove recomputations


def test_swap_holds_never_makes_a_plan_worse_and_stops_when_told() -> None:
    graph = random_training_graph(20, seed=2)
    budget = int(0.6 * checkmate.solve(graph, None).peak_memory)
    start = checkmate.solve(graph, budget, method="chen_greedy_linear")
    swapped = swap_holds(graph, start, budget, SearchControl(time_limit=5), method="swap")
    assert _within(swapped, graph, budget)[0] <= start.cost
    stopped = SearchControl(time_limit=60)
    stopped.request_stop()
    assert swap_holds(graph, start, budget, stopped, method="swap") is start
