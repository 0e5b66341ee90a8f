"""Recomputations priced apart (`Node.recompute_cost`): on tiny graphs whose recompute costs differ from their costs
(some zero, some lower, a few higher), the MILP's optimum is the exhaustive optimum priced by the paper's equations,
every lower bound stays below it, and every strategy's plan costs what its R costs by those equations."""

from __future__ import annotations

import functools

import numpy as np
import pytest
from bound_graphs import saving_graph
from exhaustive import cheapest_at, cost_peak_frontier, meets_constraints
from oracles import paper_cost_and_peak, random_valid_s, with_recompute_costs, with_workspace

import checkmate
from checkmate.bounds.closure import closure_bound
from checkmate.bounds.retention import retention_bound
from checkmate.coarsen import choose_partition, coarsen, expand_plan
from checkmate.examples import linear_graph, random_training_graph, training_graph
from checkmate.graph import Graph, Node
from checkmate.milp.backends import get_backend
from checkmate.milp.formulation import decode, encode
from checkmate.milp.problem import SolveOptions, SolveStatus
from checkmate.milp.scaling import memory_scale
from checkmate.progress import SearchControl
from checkmate.strategies.local_search import LocalSearch
from checkmate.strategies.registry import strategies

SKIP3 = training_graph([[], [0], [0, 1]], costs=[2.0, 1.0, 3.0], memory=[2, 3, 1], fixed_memory=4)
TINY = {
    "chain2": with_recompute_costs(linear_graph(2), seed=1),
    "chain3": with_recompute_costs(linear_graph(3), seed=2),
    "random2": with_recompute_costs(random_training_graph(2, seed=4, max_memory=5), seed=3),
    "skip3": with_recompute_costs(SKIP3, seed=4),
    "skip3_workspace": with_recompute_costs(with_workspace(SKIP3, seed=5), seed=5),
    **{f"saving{seed}": with_recompute_costs(saving_graph(200 + seed, size=3), seed=seed) for seed in (1, 2, 3, 6)},
}


@functools.cache
def _frontier(name: str) -> list[tuple[int, float]]:
    return cost_peak_frontier(TINY[name])


def _budgets(name: str) -> list[int]:
    """Each step of the exhaustive frontier, and one byte below the next step."""
    peaks = [peak for peak, _ in _frontier(name)]
    return sorted({*peaks, *(peak - 1 for peak in peaks[1:])})


def test_the_graphs_price_recomputations_apart() -> None:
    """Each graph has a node whose recompute cost is zero, one where it is below its cost and one above."""
    for name, graph in TINY.items():
        differs = graph.recompute_costs != graph.costs
        assert differs.any(), name
    every = np.concatenate([graph.recompute_costs - graph.costs for graph in TINY.values()])
    zero = np.concatenate([graph.recompute_costs == 0 for graph in TINY.values()]) & (
        np.concatenate([graph.costs for graph in TINY.values()]) > 0
    )
    assert zero.any() and (every < 0).any() and (every > 0).any()


@pytest.mark.parametrize("name", list(TINY))
def test_the_milp_optimum_is_the_exhaustive_optimum(name: str) -> None:
    """The raw MILP (no baselines, no shortcut): its objective is its plan's cost by the paper's equations, and the
    exhaustive optimum at every budget."""
    graph, frontier = TINY[name], _frontier(name)
    scale = memory_scale(graph)
    for budget in _budgets(name):
        problem, index = encode(graph, scale.budget_units(budget, graph.fixed_memory), scale)
        solution = get_backend("highs").solve(problem, SolveOptions(time_limit=20, mip_gap=1e-9))
        assert solution.status is SolveStatus.OPTIMAL and solution.x is not None, budget
        R, S = decode(solution.x, index)
        cost, peak = paper_cost_and_peak(graph, R, S)
        assert peak <= budget
        assert solution.objective == pytest.approx(cost, abs=1e-9)
        assert cost == pytest.approx(cheapest_at(frontier, budget), abs=1e-9), budget


@pytest.mark.parametrize("name", list(TINY))
def test_optimal_finds_the_exhaustive_optimum_and_proves_it(name: str) -> None:
    graph, frontier = TINY[name], _frontier(name)
    for budget in _budgets(name):
        plan = checkmate.solve(graph, budget, method="optimal", time_limit=20)
        assert meets_constraints(graph, plan.R, plan.S) and plan.peak_memory <= budget
        cost, peak = paper_cost_and_peak(graph, plan.R, plan.S)
        assert (plan.cost, plan.peak_memory) == (pytest.approx(cost, abs=1e-9), peak)
        assert cost == pytest.approx(cheapest_at(frontier, budget), abs=1e-9), budget
        assert plan.status == "optimal"


@pytest.mark.parametrize("name", list(TINY))
def test_every_bound_is_at_most_the_exhaustive_optimum(name: str) -> None:
    graph, frontier = TINY[name], _frontier(name)
    for budget in _budgets(name):
        optimum = cheapest_at(frontier, budget)
        assert optimum is not None
        found = {
            "lp": checkmate.lower_bound(graph, budget, time_limit=20),
            "retention": retention_bound(graph, budget).bound,
            "closure": closure_bound(graph, budget, stages=graph.size).bound,
        }
        for bound_name, bound in found.items():
            assert graph.costs.sum() - 1e-9 <= bound <= optimum + 1e-9, (bound_name, budget, bound, optimum)


@pytest.mark.parametrize("name", list(TINY))
def test_every_strategy_s_plan_costs_what_its_r_costs(name: str) -> None:
    graph, frontier = TINY[name], _frontier(name)
    for budget in _budgets(name):
        for strategy in strategies():
            options = {"time_limit": 10} if strategy.name in ("optimal", "approx") else {}
            try:
                plan = checkmate.solve(graph, budget, method=strategy.name, **options)
            except (checkmate.InfeasibleBudget, checkmate.MethodNotApplicable):
                continue
            cost, peak = paper_cost_and_peak(graph, plan.R, plan.S)
            assert (plan.cost, plan.peak_memory) == (pytest.approx(cost, abs=1e-9), peak), strategy.name
            assert cost >= cheapest_at(frontier, max(budget, peak)) - 1e-9, strategy.name


@pytest.mark.parametrize("seed", range(4))
def test_the_local_search_prices_a_state_and_a_move_as_the_equations(seed: int) -> None:
    graph = with_recompute_costs(with_workspace(random_training_graph(8, seed=seed), seed=seed), seed=seed)
    rng = np.random.default_rng(seed)
    search = LocalSearch(graph, 10**9, SearchControl())
    for density in (0.05, 0.2, 0.5):
        state = search.state(random_valid_s(graph, rng, density))
        assert state.cost == pytest.approx(paper_cost_and_peak(graph, state.R, state.S)[0], abs=1e-9)
        for move in search.holds(state, from_first_computation=True)[:4]:
            moved = search.derive(state, search.held(state, move))
            assert moved.cost == pytest.approx(paper_cost_and_peak(graph, moved.R, moved.S)[0], abs=1e-9)


@pytest.mark.parametrize(("size", "seed"), [(14, 0), (11, 1), (13, 3)])  # graphs whose coarse plans recompute
def test_an_expanded_coarse_plan_costs_no_more_than_the_coarse_plan(size: int, seed: int) -> None:
    graph = with_recompute_costs(random_training_graph(size, seed=seed), seed=seed)
    coarsening = coarsen(graph, choose_partition(graph, 7))
    coarse = coarsening.coarse
    for block in range(coarse.size):
        members = coarsening.partition.members(block)
        assert coarse.recompute_costs[block] == pytest.approx(graph.recompute_costs[members.start : members.stop].sum())
    top = checkmate.solve(coarse, None).peak_memory
    with pytest.raises(checkmate.InfeasibleBudget) as refused:
        checkmate.solve(coarse, 1, method="optimal", time_limit=10)
    floor = refused.value.minimum
    assert floor is not None
    recomputing = 0
    for budget in (floor, (floor + top) // 2):
        coarse_plan = checkmate.solve(coarse, budget, method="optimal", time_limit=10)
        recomputing += coarse_plan.recomputes
        expanded = expand_plan(coarsening, coarse_plan, method="expanded")
        cost, peak = paper_cost_and_peak(graph, expanded.R, expanded.S)
        assert (cost, peak) == (pytest.approx(expanded.cost), expanded.peak_memory)
        assert cost <= coarse_plan.cost + 1e-9
    assert recomputing


def _two_candidates(*, priced_apart: bool) -> Graph:
    """A (cost 1.0, recompute cost 0.1) and B (cost 0.5) are both read by G at the end; D, in between, runs with a
    large workspace, so at 14 bytes only one of A and B can be held across it: the other is recomputed for G."""
    return Graph(
        (
            Node("A", 1.0, 4, recompute_cost=0.1 if priced_apart else None),
            Node("B", 0.5, 4),
            Node("C", 1.0, 1, inputs=(0, 1)),
            Node("D", 1.0, 1, backward=True, inputs=(2,), workspace=8),
            Node("G", 1.0, 1, backward=True, inputs=(3, 0, 1)),
        )
    )


@pytest.mark.parametrize("method", ["optimal", "approx"])
def test_the_cheaper_recomputation_is_chosen(method: str) -> None:
    """Priced apart, recomputing A (0.1) beats recomputing B (0.5); priced per node, B (0.5) beats A (1.0)."""
    for priced_apart, recomputed, cost in ((True, 0, 4.6), (False, 1, 5.0)):
        graph = _two_candidates(priced_apart=priced_apart)
        plan = checkmate.solve(graph, 14, method=method, time_limit=10)
        again = {int(node) for node in np.flatnonzero((plan.R & ~np.eye(graph.size, dtype=bool)).any(axis=0))}
        assert again == {recomputed}, (priced_apart, again)
        assert plan.cost == pytest.approx(cost)
        assert plan.peak_memory <= 14
    assert cheapest_at(cost_peak_frontier(_two_candidates(priced_apart=True)), 14) == pytest.approx(4.6)
