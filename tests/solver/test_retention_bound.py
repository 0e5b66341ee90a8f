"""retention_bound: never above the proven optimum, every row holds for real plans, and often above no-remat."""

from __future__ import annotations

import time

import numpy as np
import pytest
from oracles import with_workspace

import checkmate
from checkmate.bounds import activation_floor
from checkmate.bounds.retention import RetentionBound, _encode, _gaps, retention_bound
from checkmate.examples import linear_graph, random_training_graph, training_graph
from checkmate.graph import Graph, Node
from checkmate.strategies.registry import strategies

FRACTIONS = (0.0, 0.15, 0.35, 0.7)  # of the way from the activation floor to the checkpoint_all peak
METHODS = [strategy.name for strategy in strategies() if strategy.name != "approx"]


def _random_graph(seed: int) -> Graph:
    """A forward DAG of 3-6 nodes, each reading its predecessor and up to two earlier nodes (multi-input), with
    its backward graph; sizes 0-9 bytes, costs 0-9, some fixed memory; workspaces (first-run and recompute) on
    every other seed."""
    rng = np.random.default_rng(seed)
    size = int(rng.integers(3, 7))
    forward_inputs: list[list[int]] = [[]]
    for node in range(1, size):
        skips = rng.integers(0, node, int(rng.integers(0, 3))).tolist()
        forward_inputs.append(sorted({node - 1, *skips}))
    graph = training_graph(
        forward_inputs,
        costs=rng.integers(0, 10, size).tolist(),
        memory=rng.integers(0, 10, size).tolist(),
        fixed_memory=int(rng.integers(0, 6)),
    )
    return with_workspace(graph, seed=seed, largest=9) if seed % 2 else graph


GRAPHS = {
    **{f"random{seed}": _random_graph(seed) for seed in range(16)},
    **{f"skips{seed}": random_training_graph(7, seed=seed) for seed in range(3)},
    "chain8": linear_graph(8),
}


def _budgets(graph: Graph) -> list[int]:
    floor = activation_floor(graph)
    peak = checkmate.solve(graph, None).peak_memory
    return sorted({int(floor + fraction * (peak - floor)) for fraction in FRACTIONS})


def _optimum(graph: Graph, budget: int) -> float | None:
    """The proven optimum within `budget` (to the MILP's 1e-4 gap), or None when no plan fits."""
    try:
        plan = checkmate.solve(graph, budget, method="optimal", time_limit=30)
    except checkmate.InfeasibleBudget:
        return None
    assert plan.status == "optimal"
    return plan.cost


def test_bound_never_exceeds_the_proven_optimum() -> None:
    trivial_only = 0
    compared = 0
    for name, graph in GRAPHS.items():
        trivial = float(graph.costs.sum())
        for budget in _budgets(graph):
            optimum = _optimum(graph, budget)
            try:
                found = retention_bound(graph, budget)
            except checkmate.InfeasibleBudget:
                assert optimum is None, f"{name} at {budget}: a plan fits, yet the bound says none does"
                continue
            if optimum is None:
                continue
            compared += 1
            assert found.proven
            assert trivial <= found.bound <= optimum + 1e-9 + 1e-4 * optimum, (name, budget, found, optimum)
            trivial_only += found.bound <= trivial + 1e-9 < optimum - 1e-9
    assert compared >= 50
    strict = [
        retention_bound(graph, budget).bound > float(graph.costs.sum()) + 1e-9
        for graph in GRAPHS.values()
        for budget in _budgets(graph)[:1]
    ]
    assert sum(strict) >= 8, "at the activation floor the bound should rise above the no-remat cost on most graphs"


def _gap_variables(graph: Graph, R: np.ndarray) -> np.ndarray:
    """x[i, g] of a plan, by the definition in the module: 1 when some stage in the gap (a, b] computes node i."""
    gaps = _gaps(graph)
    computed = np.cumsum(R.astype(np.int64), axis=0)  # computed[t, i]: stages <= t that compute i
    return (computed[gaps.b, gaps.node] - computed[gaps.a, gaps.node] > 0).astype(np.float64)


@pytest.mark.parametrize("name", ["random1", "random4", "random7", "random10", "skips0", "skips2", "chain8"])
def test_every_row_holds_for_every_plan_within_the_budget(name: str) -> None:
    """The argument row by row: every method's plan, read as x, satisfies every row, and the objective is at
    most the plan's cost (a failure names a row that some real plan breaks)."""
    graph = GRAPHS[name]
    checked = recomputing = 0
    for budget in [None, *_budgets(graph)]:
        for method in METHODS:
            try:
                plan = checkmate.solve(
                    graph, budget, method=method, **({"time_limit": 30} if method == "optimal" else {})
                )
            except (checkmate.InfeasibleBudget, checkmate.MethodNotApplicable):
                continue
            problem, cost_unit = _encode(graph, plan.peak_memory if budget is None else budget)
            x = _gap_variables(graph, plan.R)
            activity = problem.A @ x
            assert (activity >= problem.row_lower - 1e-9).all(), (method, budget, np.flatnonzero(activity < 0))
            assert (x <= problem.col_upper).all(), (method, budget)
            assert float(graph.costs.sum()) + cost_unit * float(problem.c @ x) <= plan.cost + 1e-9
            checked += 1
            recomputing += bool(x.any())
    assert checked >= 5
    assert recomputing >= 1


@pytest.mark.parametrize("seed", range(2))
def test_tighter_than_the_lp_bound_on_branching_graphs(seed: int) -> None:
    """Observed, not a theorem: on these 21-stage graphs the retention bound is at or above the paper's LP bound
    at every budget and strictly above it at most (on 80 graph-budget pairs it never fell below)."""
    graph = random_training_graph(10, seed=seed)
    higher = 0
    for budget in _budgets(graph):
        found = retention_bound(graph, budget).bound
        lp = checkmate.lower_bound(graph, budget, time_limit=30)
        assert found >= lp - 1e-6
        higher += found > lp + 1e-6
    assert higher >= 3


def test_chain_at_its_smallest_budget() -> None:
    """The 13-stage chain (peak 8 bytes) at its smallest budget, 4: the bound proves 17 (four recomputations),
    the optimum is 18; from 5 to 8 bytes the bound is the optimum."""
    graph = linear_graph(6)
    found = retention_bound(graph, 4)
    assert found == RetentionBound(bound=17.0, proven=True, seconds=found.seconds)
    assert _optimum(graph, 4) == 18.0
    assert [retention_bound(graph, budget).bound for budget in (5, 6, 7, 8)] == [16.0, 15.0, 14.0, 13.0]


def test_an_input_held_across_the_gap_counts_once_at_a_recomputation() -> None:
    """A recompute row counts an input of the recomputed node once, even when a kept gap of that input spans the
    recomputation too (counting it twice gives 51.49 here, above the optimum)."""
    graph = with_workspace(random_training_graph(5, seed=29), seed=29, largest=6)
    assert retention_bound(graph, 22).bound == pytest.approx(50.26)
    assert _optimum(graph, 22) == pytest.approx(50.26)


def test_no_recomputation_at_the_checkpoint_all_peak() -> None:
    graph = random_training_graph(8, seed=3)
    peak = checkmate.solve(graph, None).peak_memory
    assert retention_bound(graph, peak).bound == pytest.approx(graph.costs.sum())


def test_budget_below_a_nodes_working_set_raises() -> None:
    graph = random_training_graph(5, seed=1)
    floor = activation_floor(graph)
    with pytest.raises(checkmate.InfeasibleBudget, match="needs") as caught:
        retention_bound(graph, floor - 1)
    assert caught.value.budget == floor - 1
    assert retention_bound(graph, floor).bound >= graph.costs.sum()


def test_a_value_too_big_to_rebuild_must_be_kept() -> None:
    """Huge recompute workspaces forbid every recomputation (the recompute rows fix x = 0): below the
    checkpoint_all peak nothing fits, which the bound proves as the optimal MILP does."""
    base = random_training_graph(5, seed=0)
    graph = Graph(
        tuple(Node(n.name, n.cost, n.memory, n.backward, n.inputs, recompute_workspace=10**6) for n in base.nodes)
    )
    peak = checkmate.solve(graph, None).peak_memory
    assert activation_floor(graph) < peak - 1
    assert _optimum(graph, peak - 1) is None
    with pytest.raises(checkmate.InfeasibleBudget, match="infeasible"):
        retention_bound(graph, peak - 1)
    assert retention_bound(graph, peak).bound == pytest.approx(graph.costs.sum())


def test_hundreds_of_nodes_in_seconds() -> None:
    graph = random_training_graph(200, seed=11)  # 401 stages
    budget = int(0.5 * checkmate.solve(graph, None).peak_memory)
    started = time.perf_counter()
    found = retention_bound(graph, budget, time_limit=20)
    assert time.perf_counter() - started < 20
    assert found.bound > graph.costs.sum()
    assert found.bound <= checkmate.solve(graph, budget, method="chen_greedy_linear").cost
