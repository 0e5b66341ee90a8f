"""retention_bound: never above the proven optimum, every row holds for real plans, and often above no-remat."""

from __future__ import annotations

import time

import numpy as np
import pytest
import scipy.sparse as sp
from bound_graphs import GRAPHS, against_the_optimum, budgets, proven_optimum, saving_graph
from exhaustive import fewest_computations
from oracles import with_workspace

import checkmate
from checkmate.bounds import activation_floor, retention
from checkmate.bounds.gaps import Gaps, last_use, memory_gaps
from checkmate.bounds.input_cover import InputCover, input_cover
from checkmate.bounds.retention import RetentionBound, _encode, retention_bound
from checkmate.examples import linear_graph, random_training_graph
from checkmate.graph import Graph, Node
from checkmate.strategies.registry import strategies

METHODS = [strategy.name for strategy in strategies() if strategy.name != "approx"]


def test_bound_never_exceeds_the_proven_optimum() -> None:
    trivial_only = 0
    compared = 0
    for name, graph, budget, found, optimum in against_the_optimum(retention_bound):
        trivial = float(graph.costs.sum())
        compared += 1
        assert found.proven
        assert trivial <= found.bound <= optimum + 1e-9 + 1e-4 * optimum, (name, budget, found, optimum)
        trivial_only += found.bound <= trivial + 1e-9 < optimum - 1e-9
    assert compared >= 50
    strict = [
        retention_bound(graph, budget).bound > float(graph.costs.sum()) + 1e-9
        for graph in GRAPHS.values()
        for budget in budgets(graph)[:1]
    ]
    assert sum(strict) >= 8, "at the activation floor the bound should rise above the no-remat cost on most graphs"


def _plan_variables(graph: Graph, R: np.ndarray, S: np.ndarray, gaps: Gaps, cover: InputCover) -> np.ndarray:
    """Every column of the retention MILP read off a plan, by the definitions in the module docs: x[i, g] = 1 when
    some stage of the gap computes node i; t_j = 1 when some stage after j's last use computes j; a held column of
    node n in stage t is S[t + 1, n], where the gap of that stage is recomputed (w) or no stage after the last use
    computes n (h), else 0."""
    computed = np.cumsum(R.astype(np.int64), axis=0)  # computed[t, i]: stages <= t that compute i
    x = computed[gaps.b, gaps.node] - computed[gaps.a, gaps.node] > 0
    last = last_use(graph)
    tail = computed[-1] - computed[last, np.arange(graph.size)] > 0
    node, stage = cover.held_node, cover.held_stage
    held_next = np.zeros(node.size, dtype=bool)
    inside = stage + 1 < graph.size
    held_next[inside] = S[stage[inside] + 1, node[inside]]
    recomputed_gap = np.zeros(node.size, dtype=bool)
    for k in np.flatnonzero(stage <= last[node]):  # a w column: find its gap
        (g,) = np.flatnonzero((gaps.node == node[k]) & (gaps.a < stage[k]) & (stage[k] < gaps.b))
        recomputed_gap[k] = x[g]
    held = held_next & np.where(stage > last[node], ~tail[node], recomputed_gap)
    return np.concatenate([x, tail[cover.tail_nodes], held]).astype(np.float64)


@pytest.mark.parametrize(
    "name", ["random1", "random4", "random7", "random10", "skips0", "skips2", "chain8", "saving0", "saving3", "saving5"]
)
def test_every_row_holds_for_every_plan_within_the_budget(name: str) -> None:
    """The argument row by row: every method's plan, read as x, satisfies every row, and the objective is at
    most the plan's cost (a failure names a row that some real plan breaks)."""
    graph = GRAPHS[name]
    checked = recomputing = covered = 0
    for budget in [None, *budgets(graph)]:
        for method in METHODS:
            try:
                plan = checkmate.solve(
                    graph, budget, method=method, **({"time_limit": 30} if method == "optimal" else {})
                )
            except (checkmate.InfeasibleBudget, checkmate.MethodNotApplicable):
                continue
            encoded = _encode(graph, plan.peak_memory if budget is None else budget)
            values = _plan_variables(graph, plan.R, plan.S, encoded.gaps, encoded.cover)
            problem = encoded.problem
            activity = problem.A @ values
            broken = np.flatnonzero(activity < problem.row_lower - 1e-9)
            assert broken.size == 0, (method, budget, broken)
            assert (values <= problem.col_upper).all(), (method, budget)
            assert float(graph.costs.sum()) + encoded.cost_unit * float(problem.c @ values) <= plan.cost + 1e-9
            checked += 1
            recomputing += bool(values[: encoded.gaps.node.size].any())
            covered += encoded.cover.rows.lower.size
    assert checked >= 5
    assert recomputing >= 1
    print(name, "cover rows", covered)


@pytest.mark.parametrize("seed", range(2))
def test_tighter_than_the_lp_bound_on_branching_graphs(seed: int) -> None:
    """Observed, not a theorem: on these 21-stage graphs the retention bound is at or above the paper's LP bound
    at every budget and strictly above it at most (on 80 graph-budget pairs it never fell below)."""
    graph = random_training_graph(10, seed=seed)
    higher = 0
    for budget in budgets(graph):
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
    assert proven_optimum(graph, 4) == 18.0
    assert [retention_bound(graph, budget).bound for budget in (5, 6, 7, 8)] == [16.0, 15.0, 14.0, 13.0]


def test_an_input_held_across_the_gap_counts_once_at_a_recomputation() -> None:
    """A recompute row counts an input of the recomputed node once, even when a kept gap of that input spans the
    recomputation too (counting it twice gives 51.49 here, above the optimum)."""
    graph = with_workspace(random_training_graph(5, seed=29), seed=29, largest=6)
    assert retention_bound(graph, 22).bound == pytest.approx(50.26)
    assert proven_optimum(graph, 22) == pytest.approx(50.26)


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
    assert proven_optimum(graph, peak - 1) is None
    with pytest.raises(checkmate.InfeasibleBudget, match="infeasible"):
        retention_bound(graph, peak - 1)
    assert retention_bound(graph, peak).bound == pytest.approx(graph.costs.sum())


@pytest.mark.serial  # a wall-clock bound equal to the call's own time limit: the other core would lengthen it
def test_hundreds_of_nodes_in_seconds() -> None:
    graph = random_training_graph(200, seed=11)  # 401 stages
    budget = int(0.5 * checkmate.solve(graph, None).peak_memory)
    started = time.perf_counter()
    found = retention_bound(graph, budget, time_limit=20)
    assert time.perf_counter() - started < 20
    assert found.bound > graph.costs.sum()
    assert found.bound <= checkmate.solve(graph, budget, method="chen_greedy_linear").cost


def test_the_input_cover_raises_the_bound_on_graphs_that_save_little() -> None:
    """Where gradient nodes read only part of their op's values, the input cover lifts the bound above the plain
    retention MILP on some budgets, never above the optimum (checked beside the others in
    test_bound_never_exceeds_the_proven_optimum)."""
    raised = compared = 0
    for name, graph in GRAPHS.items():
        if not name.startswith("saving"):
            continue
        for budget in budgets(graph):
            try:
                plain_bound = retention_bound(graph, budget, cover=False).bound
            except checkmate.InfeasibleBudget:
                continue
            with_cover = retention_bound(graph, budget).bound
            compared += 1
            assert with_cover >= plain_bound - 1e-9, (name, budget)
            raised += with_cover > plain_bound + 1e-9
    assert compared >= 20
    assert raised >= 3, f"the cover raised the bound on {raised} of {compared} budgets"


@pytest.mark.parametrize("seed", range(4))
def test_the_input_cover_rows_hold_for_every_plan_of_a_tiny_graph(seed: int) -> None:
    """The cover, tail and order rows over plans of every kind, not only the strategies' plans: 3,000 random S
    (values held past their last use too), each with the fewest computations it allows (`exhaustive`), read as the
    input cover's columns at every stage (the rows hold for any set of stages; the MILP charges the binding ones),
    meet every row. Counted: plans that recompute a gap whose input is dead, and held columns of both kinds."""
    graph = saving_graph(100 + seed, size=6)
    gaps = memory_gaps(graph)
    cover = input_cover(graph, gaps, np.arange(graph.size))
    rows = cover.rows
    logic = sp.csr_array(
        (rows.values, (rows.rows, rows.cols)), shape=(rows.lower.size, gaps.node.size + cover.num_columns)
    )
    stage, node = np.tril_indices(graph.size, k=-1)
    rng = np.random.default_rng(seed)
    covering = holding_past_last_use = 0
    for density in rng.random(3000):
        S = np.zeros((graph.size, graph.size), dtype=bool)
        S[stage, node] = rng.random(stage.size) < density
        R = fewest_computations(graph, S)
        values = _plan_variables(graph, R, S, gaps, cover)
        activity = logic @ values
        broken = np.flatnonzero(activity < rows.lower - 1e-9)
        assert broken.size == 0, (S.astype(int), broken)
        held = values[gaps.node.size + cover.tail_nodes.size :]
        covering += bool((values[: gaps.node.size] > 0).any() and held.any())
        holding_past_last_use += bool(held[cover.held_stage > last_use(graph)[cover.held_node]].any())
    assert covering >= 300 and holding_past_last_use >= 100, (covering, holding_past_last_use)


def test_too_little_time_to_presolve_gives_the_trivial_bound_without_a_solver(monkeypatch: pytest.MonkeyPatch) -> None:
    """Below `PRESOLVE_SECONDS_PER_NONZERO` times the MILP's nonzeros the bound is every node once, at once: HiGHS
    would presolve past the limit (3.0 s under a 1 s limit on a 901-node graph)."""
    graph = random_training_graph(40, seed=2)
    budget = int(0.6 * checkmate.solve(graph, None).peak_memory)
    nonzeros = _encode(graph, budget, cover=False).problem.A.nnz
    enough = nonzeros * retention.PRESOLVE_SECONDS_PER_NONZERO

    def no_solver() -> None:
        raise AssertionError("a solver was called with too little time to presolve")

    monkeypatch.setattr(retention, "lp_backend", no_solver)
    found = retention_bound(graph, budget, time_limit=0.5 * enough)
    assert found.bound == pytest.approx(float(graph.costs.sum())) and not found.proven
    monkeypatch.undo()
    assert retention_bound(graph, budget, time_limit=10 + enough).bound > float(graph.costs.sum())
