"""Coarsening: partitions, conservative coarse memory, and expanded plans checked against the paper's equations."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from oracles import paper_cost_and_peak, random_valid_s, with_workspace

import checkmate
from checkmate.coarsen import Partition, choose_partition, coarsen, expand_plan
from checkmate.errors import InvalidGraph
from checkmate.examples import linear_graph, random_training_graph
from checkmate.plan import cheapest_r, make_plan, prune_checkpoints
from checkmate.strategies.warm_start import BASELINES


def test_partition_blocks_are_consecutive_runs_of_one_phase() -> None:
    graph = random_training_graph(20, seed=3)
    partition = choose_partition(graph, 9)
    assert partition.num_blocks == 9
    assert list(partition.block_of) == sorted(partition.block_of)
    for block in range(partition.num_blocks):
        phases = {bool(graph.is_backward[node]) for node in partition.members(block)}
        assert len(phases) == 1, f"block {block} mixes the forward and backward pass"


def _forward_graph(costs: list[float], memory: list[int], inputs: list[tuple[int, ...]]) -> checkmate.Graph:
    return checkmate.Graph(
        tuple(
            checkmate.Node(f"op{index}", cost, size, inputs=reads)
            for index, (cost, size, reads) in enumerate(zip(costs, memory, inputs, strict=True))
        )
    )


def test_a_node_read_only_by_its_successor_merges_first() -> None:
    # node 0 is read by 1 and by 3 (a skip connection); 1 and 2 are read only by their successor
    graph = _forward_graph([1.0] * 4, [1] * 4, [(), (0,), (1,), (2, 0)])
    assert choose_partition(graph, 3).starts == (0, 1, 3)


def test_expensive_nodes_stay_apart_longest() -> None:
    graph = _forward_graph([1.0, 1.0, 50.0, 50.0, 1.0, 1.0], [1] * 6, [(), (0,), (1,), (2,), (3,), (4,)])
    partition = choose_partition(graph, 2)
    assert partition.block_of[2] != partition.block_of[3]


def test_the_smaller_of_two_equally_cheap_merges_comes_first() -> None:
    graph = _forward_graph([1.0] * 4, [100, 100, 1, 1], [(), (0,), (1,), (2,)])
    assert choose_partition(graph, 3).starts == (0, 1, 2)


def test_partition_validates_its_starts() -> None:
    with pytest.raises(InvalidGraph):
        Partition((1, 3), 5)
    with pytest.raises(InvalidGraph):
        Partition((0, 3, 3), 5)
    assert Partition.singletons(4).num_blocks == 4


def test_singleton_partition_gives_back_the_graph() -> None:
    graph = with_workspace(random_training_graph(6, seed=1), seed=1)
    coarsening = coarsen(graph, Partition.singletons(graph.size))
    for fine, coarse in zip(graph.nodes, coarsening.coarse.nodes, strict=True):
        assert (coarse.cost, coarse.inputs, coarse.workspace) == (
            fine.cost,
            tuple(sorted(set(fine.inputs))),
            fine.workspace,
        )
    assert np.array_equal(coarsening.coarse.memory, np.where(coarsening.exported, graph.memory, 0))


def test_a_chain_block_exports_only_what_other_blocks_read() -> None:
    graph = linear_graph(4)  # forward 0..3, loss 4, backward 5..8; forward j is read by j + 1 and by backward
    coarsening = coarsen(graph, Partition((0, 2, 4, 5, 7), graph.size))
    assert coarsening.coarse.size == 5
    assert coarsening.coarse.nodes[0].inputs == ()
    assert coarsening.coarse.nodes[1].inputs == (0,)
    # the backward block {5, 6}: node 5 is read only by 6, inside the block, so only 6 is exported
    assert coarsening.coarse.nodes[3].memory == graph.nodes[6].memory
    assert coarsening.coarse.nodes[3].workspace == graph.nodes[5].memory


def _coarse_plans(coarse: checkmate.Graph, budget: int) -> list[checkmate.Plan]:
    plans = []
    for name in (*BASELINES, "optimal"):
        options = {"time_limit": 10} if name == "optimal" else {}
        try:
            plans.append(checkmate.solve(coarse, budget, method=name, **options))
        except (checkmate.InfeasibleBudget, checkmate.MethodNotApplicable):
            continue
    return plans


@pytest.mark.parametrize("seed", range(6))
def test_expanded_plans_cost_and_peak_no_more_than_the_coarse_plan(seed: int) -> None:
    graph = random_training_graph(7 + seed, seed=seed)
    if seed % 2:
        graph = with_workspace(graph, seed=seed)
    coarsening = coarsen(graph, choose_partition(graph, 6 + seed % 3))
    top = checkmate.solve(coarsening.coarse, None).peak_memory
    checked = 0
    for fraction in (0.6, 0.8, 1.0):
        for coarse_plan in _coarse_plans(coarsening.coarse, int(fraction * top)):
            expanded = expand_plan(coarsening, coarse_plan, method="expanded")
            cost, peak = paper_cost_and_peak(graph, expanded.R, expanded.S)
            assert (cost, peak) == (pytest.approx(expanded.cost), expanded.peak_memory)
            assert cost <= coarse_plan.cost + 1e-9
            assert peak <= coarse_plan.peak_memory
            checked += 1
    assert checked >= 3


def _holds_only_what_is_read_or_held_on(graph: checkmate.Graph, plan: checkmate.Plan) -> None:
    for t in range(1, graph.size):
        read = {i for k in np.flatnonzero(plan.R[t]) for i in graph.predecessors[k]}
        held_on = set(np.flatnonzero(plan.S[t + 1])) if t + 1 < graph.size else set()
        assert set(np.flatnonzero(plan.S[t])) <= read | held_on, f"stage {t} holds values it never reads"


def test_a_held_block_is_dropped_member_by_member_after_its_last_reader() -> None:
    """Block {0, 1} is held until the gradient of node 1 and recomputed for the gradient of node 0: in the
    gradient stage of node 1, node 0 is held by the coarse plan but read by nothing."""
    graph = linear_graph(4)
    coarsening = coarsen(graph, Partition((0, 2, 4, 5, 6, 7, 8), graph.size))
    S = np.zeros((7, 7), dtype=bool)
    S[1:6, 0] = S[2:5, 1] = S[3, 2] = S[4, 3] = S[5, 4] = S[6, 5] = True
    R = np.eye(7, dtype=bool)
    R[6, 0] = True
    coarse_plan = make_plan(coarsening.coarse, R, S, method="by hand")
    expanded = expand_plan(coarsening, coarse_plan, method="expanded")
    _holds_only_what_is_read_or_held_on(graph, expanded)
    assert paper_cost_and_peak(graph, expanded.R, expanded.S)[1] <= coarse_plan.peak_memory


@pytest.mark.parametrize(("size", "seed"), [(14, 0), (11, 1), (13, 3), (14, 4)])  # graphs whose coarse plans recompute
def test_every_value_the_expanded_plan_holds_is_read_in_its_stage_or_held_on(size: int, seed: int) -> None:
    """The coarse plan frees a held block after its last reader in the stage; a member no node of the stage reads
    must not be held into it (it would stay live to the stage's end, above the coarse accounting)."""
    graph = random_training_graph(size, seed=seed)
    coarsening = coarsen(graph, choose_partition(graph, 7))
    coarse = coarsening.coarse
    top = checkmate.solve(coarse, None).peak_memory
    with pytest.raises(checkmate.InfeasibleBudget) as refused:
        checkmate.solve(coarse, 1, method="optimal", time_limit=10)
    floor = refused.value.minimum
    assert floor is not None
    plans = [plan for budget in {floor, (floor + top) // 2, top} for plan in _coarse_plans(coarse, budget)]
    recomputing = [plan for plan in plans if plan.R.sum() > coarse.size]
    assert recomputing, "no coarse plan recomputes a block: the test would check too little"
    for coarse_plan in plans:
        _holds_only_what_is_read_or_held_on(graph, expand_plan(coarsening, coarse_plan, method="expanded"))


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(forward=st.integers(2, 9), seed=st.integers(0, 10_000))
def test_pruning_checkpoints_never_raises_cost_or_peak(forward: int, seed: int) -> None:
    graph = with_workspace(random_training_graph(forward, seed=seed), seed=seed)
    S = random_valid_s(graph, np.random.default_rng(seed))
    R = cheapest_r(graph, S)
    before = paper_cost_and_peak(graph, R, S)
    pruned_R, pruned_S = prune_checkpoints(graph, R, S)
    after = paper_cost_and_peak(graph, pruned_R, pruned_S)
    assert after[0] <= before[0] + 1e-9 and after[1] <= before[1]
    assert not (pruned_S & ~S).any()
    make_plan(graph, pruned_R, pruned_S, method="pruned")  # valid: raises InvalidSchedule otherwise
