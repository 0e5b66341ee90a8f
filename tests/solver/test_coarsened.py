"""optimal on graphs above `exact_nodes`: coarsen, solve, expand, improve; checked against exhaustive search and the
paper's equations, under time limits and stop requests."""

from __future__ import annotations

import dataclasses
import functools
import math
import time

import pytest
from exhaustive import cheapest_at, cost_peak_frontier
from oracles import paper_cost_and_peak, with_opening_held, with_stage_held, with_workspace

import checkmate
from checkmate.examples import random_training_graph, training_graph
from checkmate.graph import Graph
from checkmate.progress import Progress
from checkmate.strategies.policy import POLICY

SMALL = {
    "random3": random_training_graph(3, seed=7, max_memory=5),
    "skip3": training_graph([[], [0], [0, 1]], costs=[2.0, 1.0, 3.0], memory=[2, 3, 1], fixed_memory=4),
    "workspace3": with_workspace(
        training_graph([[], [0], [0, 1]], costs=[2.0, 1.0, 3.0], memory=[2, 3, 1], fixed_memory=4), seed=5
    ),
}


@functools.cache
def _frontier(name: str) -> list[tuple[int, float]]:
    return cost_peak_frontier(SMALL[name])


def _check_with_oracle(plan: checkmate.Plan, graph: Graph, budget: int) -> None:
    cost, peak = paper_cost_and_peak(graph, plan.R, plan.S)
    assert peak <= budget
    assert (cost, peak) == (pytest.approx(plan.cost), plan.peak_memory)


@pytest.mark.parametrize("name", list(SMALL))
def test_the_coarsened_path_on_singleton_blocks_finds_the_exhaustive_optimum(name: str) -> None:
    """With one block per node the coarse MILP is the full one (backward nodes computed once): on these graphs it
    reaches the exhaustive optimum at every budget, and its bound (the retention bound) never exceeds it."""
    graph = SMALL[name]
    frontier = _frontier(name)
    for budget in range(frontier[0][0], frontier[-1][0] + 1):
        plan = checkmate.solve(graph, budget, method="optimal", exact_nodes=1, coarse_nodes=graph.size, time_limit=20)
        _check_with_oracle(plan, graph, budget)
        optimum = cheapest_at(frontier, budget)
        assert plan.cost == pytest.approx(optimum)
        assert plan.lower_bound is not None and plan.lower_bound <= optimum + 1e-9


@pytest.mark.parametrize("seed", range(4))
def test_coarsened_plans_fit_their_budget_by_the_papers_equations(seed: int) -> None:
    """Seed 3: with bytes held outside the plan in each stage and at stage starts (a sharded step's units)."""
    graph = with_workspace(random_training_graph(30, seed=seed), seed=seed)
    if seed == 3:
        graph = with_opening_held(with_stage_held(graph, seed=seed, largest=8), seed=seed, largest=40)
    reference = checkmate.solve(graph, None)
    checked = 0
    for fraction in (0.5, 0.7, 0.9):
        budget = int(fraction * reference.peak_memory)
        try:
            plan = checkmate.solve(graph, budget, method="optimal", exact_nodes=20, coarse_nodes=12, time_limit=10)
        except checkmate.InfeasibleBudget:
            continue
        checked += 1
        _check_with_oracle(plan, graph, budget)
        assert plan.lower_bound is not None and plan.lower_bound <= plan.cost
        best_baseline = min(
            (p.cost for p in _baselines(graph, budget)),
            default=float("inf"),
        )
        assert plan.cost <= best_baseline + 1e-9
    assert checked >= 2, f"only {checked} of 3 budgets had a plan: the test checked too little"


@pytest.mark.slow
def test_time_left_goes_to_finer_coarse_graphs() -> None:
    """A 61-node graph at 50 % through a 6-node coarse graph: with the time the search has left, finer coarse graphs
    (9, 13, 19 and 28 nodes) find a cheaper plan than the 6-node one, as checked by the paper's equations; with
    `refine_minimum` out of reach (no finer graphs) the same call returns the 6-node path's plan."""
    graph = random_training_graph(30, seed=1)
    budget = int(0.5 * checkmate.solve(graph, None).peak_memory)
    costs = {}
    for minimum in (math.inf, 0.0):
        policy = dataclasses.replace(POLICY, refine_minimum=minimum)
        plan = checkmate.solve(
            graph, budget, method="optimal", exact_nodes=20, coarse_nodes=6, time_limit=24, mip_gap=0.01, policy=policy
        )  # 24 s: with 12, beside another test worker or two busy cores, the finer graphs had no time left (1 in 2)
        _check_with_oracle(plan, graph, budget)
        costs[minimum] = plan.cost
    assert costs[0.0] < costs[math.inf] - 1e-9, costs


def _baselines(graph: Graph, budget: int) -> list[checkmate.Plan]:
    plans = []
    for name in ("chen_sqrtn_linear", "chen_greedy_linear", "checkpoint_all"):
        try:
            plans.append(checkmate.solve(graph, budget, method=name))
        except checkmate.InfeasibleBudget:
            continue
    return plans


@pytest.mark.slow
@pytest.mark.serial
@pytest.mark.parametrize("method", ["optimal", "approx"])
def test_a_time_limit_bounds_the_whole_call_on_a_large_graph(method: str) -> None:
    graph = random_training_graph(150, seed=3)  # 301 nodes: the coarsened path
    budget = int(0.6 * checkmate.solve(graph, None).peak_memory)
    started = time.perf_counter()
    plan = checkmate.solve(graph, budget, method=method, time_limit=10)
    elapsed = time.perf_counter() - started
    assert elapsed <= 10 * 1.15 + 0.5
    _check_with_oracle(plan, graph, budget)


def test_a_stop_request_returns_the_best_plan_so_far() -> None:
    """What Ctrl-C does (`checkmate.progress.stop_on_interrupt`): the search stops at once with a valid plan."""
    graph = random_training_graph(100, seed=1)
    budget = int(0.6 * checkmate.solve(graph, None).peak_memory)
    control = checkmate.progress.SearchControl(time_limit=120)
    snapshots: list[Progress] = []

    def stop_after_the_first_plan(snapshot: Progress) -> None:
        snapshots.append(snapshot)
        if snapshot.best_cost is not None:
            control.request_stop()

    control.callback = stop_after_the_first_plan
    started = time.perf_counter()
    plan = checkmate.solve(graph, budget, method="optimal", control=control)
    assert time.perf_counter() - started < 30
    _check_with_oracle(plan, graph, budget)
    assert snapshots and plan.cost <= min(s.best_cost for s in snapshots if s.best_cost is not None)
