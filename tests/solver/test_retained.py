"""Bytes a node retains to the end of the step (`Node.retained`: gradients when `.grad` starts each step empty).

Oracles: the exhaustive search priced by the paper's equations with retained bytes counted from each node's first
run (`oracles.paper_cost_and_peak`, which tracks the nodes computed so far, not stages).
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from exhaustive import cheapest_at, cost_peak_frontier, meets_constraints
from oracles import (
    paper_cost_and_peak,
    random_valid_s,
    with_opening_held,
    with_retained,
    with_stage_held,
    with_workspace,
)

import checkmate
from checkmate import Graph, cheapest_r
from checkmate.bounds import BudgetRange, activation_floor
from checkmate.coarsen.coarse_graph import coarsen
from checkmate.coarsen.expand import expand_plan
from checkmate.coarsen.partition import choose_partition
from checkmate.examples import random_training_graph
from checkmate.milp.backends import get_backend
from checkmate.milp.formulation import decode, encode
from checkmate.milp.problem import SolveOptions, SolveStatus
from checkmate.milp.scaling import memory_scale

GRAPHS = [with_retained(with_workspace(random_training_graph(2, seed=seed), seed=seed), seed=seed) for seed in (3, 8)]
GRAPHS.append(with_stage_held(GRAPHS[0], seed=3))  # and bytes held outside the plan per stage (a sharded step's)
GRAPHS.append(with_opening_held(GRAPHS[-1], seed=3))  # and at some stages' starts (its reduce-scatters between them)


@pytest.mark.parametrize("graph", GRAPHS, ids=["seed3", "seed8", "seed3-stage-held", "seed3-opening-held"])
def test_the_milp_alone_finds_the_exhaustive_optimum_and_its_answer_fits(graph: Graph) -> None:
    """Solved and decoded with nothing after it (`optimal` re-checks every plan and would hide a wrong row)."""
    assert graph.retained.any()
    frontier = cost_peak_frontier(graph)
    scale = memory_scale(graph)
    assert scale.exact
    for budget in range(frontier[0][0] - 2, frontier[-1][0] + 2):
        problem, index = encode(graph, scale.budget_units(budget, graph.fixed_memory), scale)
        solution = get_backend("highs").solve(problem, SolveOptions(time_limit=20))
        optimum = cheapest_at(frontier, budget)
        if optimum is None:
            assert solution.x is None, budget
            continue
        assert solution.status is SolveStatus.OPTIMAL, budget
        R, S = decode(solution.x, index)
        assert meets_constraints(graph, R, S)
        cost, peak = paper_cost_and_peak(graph, R, S)
        assert peak <= budget
        assert cost == pytest.approx(optimum), budget


def test_retained_bytes_count_from_the_node_s_first_run_to_the_end() -> None:
    """A node that retains r bytes raises the peak of its own first moment and of every later one by r."""
    graph = with_workspace(random_training_graph(3, seed=2), seed=2)
    rng = np.random.default_rng(0)
    S = random_valid_s(graph, rng, 0.3)
    R = cheapest_r(graph, S)
    base = checkmate.lower(graph, R, S).usage
    last = graph.size - 1
    nodes = list(graph.nodes)
    nodes[last] = dataclasses.replace(nodes[last], retained=1000)
    usage = checkmate.lower(Graph(tuple(nodes), fixed_memory=graph.fixed_memory), R, S).usage
    assert usage[-1] == base[-1] + 1000
    assert usage[:-1] == base[:-1]


def test_minimum_budget_and_lower_bounds_count_retained_bytes() -> None:
    graph = GRAPHS[0]
    lowest = cost_peak_frontier(graph)[0][0]
    assert checkmate.minimum_budget(graph) == BudgetRange(lowest, lowest)
    assert activation_floor(graph) <= lowest
    with pytest.raises(checkmate.InfeasibleBudget):
        checkmate.solve(graph, lowest - 1, method="optimal", time_limit=20)


@pytest.mark.parametrize("seed", range(3))
def test_a_coarse_plan_bounds_its_expansion_with_retained_bytes(seed: int) -> None:
    graph = with_retained(with_workspace(random_training_graph(7 + seed, seed=seed), seed=seed), seed=seed)
    coarsening = coarsen(graph, choose_partition(graph, 6))
    assert coarsening.coarse.retained.sum() == graph.retained.sum()
    top = checkmate.solve(coarsening.coarse, None).peak_memory
    lowest = checkmate.minimum_budget(coarsening.coarse).upper
    assert lowest is not None
    for budget in (lowest, (lowest + top) // 2, top):
        coarse_plan = checkmate.solve(coarsening.coarse, budget, method="optimal", time_limit=10)
        expanded = expand_plan(coarsening, coarse_plan, method="expanded")
        cost, peak = paper_cost_and_peak(graph, expanded.R, expanded.S)
        assert (cost, peak) == (pytest.approx(expanded.cost), expanded.peak_memory)
        assert peak <= coarse_plan.peak_memory


def test_retained_bytes_survive_the_json_round_trip() -> None:
    graph = GRAPHS[0]
    assert Graph.from_json(graph.to_json()) == graph
    assert '"retained"' in graph.to_json()
    assert '"retained"' not in random_training_graph(2, seed=3).to_json()
