"""The paper's baselines: checkpoint_all, Chen √n and greedy (articulation points and linearised), Griewank revolve.

Oracles: the paper's cost and U recurrence (`oracles.paper_cost_and_peak`), a brute-force cut-vertex search,
Griewank's closed form for the number of forward steps of binomial checkpointing, and hand-worked examples.
"""

from __future__ import annotations

import functools
import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from oracles import paper_cost_and_peak

from checkmate import Graph, InfeasibleBudget, InvalidSchedule, MethodNotApplicable, Node, check_plan, solve
from checkmate.examples import linear_graph, random_training_graph, training_graph
from checkmate.progress import SearchControl
from checkmate.strategies import chen, registry
from checkmate.strategies.chen import chen_greedy_linear, chen_sqrtn, greedy_plan
from checkmate.strategies.common import plan_from_s
from checkmate.strategies.griewank import griewank, revolve_plan
from checkmate.strategies.registry import Strategy, call_strategy
from checkmate.strategies.segments import (
    articulation_points,
    checkpoint_s,
    every_kth,
    forward_nodes,
    greedy_checkpoints,
)

CHEN = ["chen_sqrtn", "chen_sqrtn_linear", "chen_greedy", "chen_greedy_linear"]
BASELINES = ["checkpoint_all", *CHEN]
BRANCHING = [random_training_graph(n, seed=seed, skip_probability=0.4) for n, seed in [(6, 1), (12, 2), (20, 3)]]
# A U-Net-like graph: encoder 0-3, decoder 4-7 with skips 0->7, 1->6, 2->5; few articulation points.
UNET = training_graph([[], [0], [1], [2], [3], [4, 2], [5, 1], [6, 0]], memory=[4, 3, 2, 1, 1, 2, 3, 4])


def brute_force_cut_vertices(graph: Graph) -> list[int]:
    """Forward nodes on every route from the batch to the loss, found by deleting each node in turn.

    The forward graph is the paper's: the forward nodes the loss (what the first backward node reads) depends on.
    A virtual source is joined to its first node, a virtual sink to the loss; other nodes without inputs read only
    memory that is always held and are left out.
    """
    nodes = graph.nodes
    first_backward = next((k for k, node in enumerate(nodes) if node.backward), None)
    loss = [] if first_backward is None else [i for i in nodes[first_backward].inputs if not nodes[i].backward]
    if not loss:
        loss = [max(i for i, node in enumerate(nodes) if not node.backward)]
    path: set[int] = set()

    def visit(j: int) -> None:
        if j not in path:
            path.add(j)
            for i in nodes[j].inputs:
                if not nodes[i].backward:
                    visit(i)

    for j in loss:
        visit(j)
    start = min(path)
    vertices = [j for j in sorted(path) if j == start or nodes[j].inputs]
    edges = [(i, j) for j in vertices for i in nodes[j].inputs if i in vertices]
    edges += [("source", start)] + [(j, "sink") for j in loss if j in vertices]

    def connected(removed: object) -> bool:
        reached, frontier = {"source"}, ["source"]
        while frontier:
            v = frontier.pop()
            for a, b in edges:
                for x, y in ((a, b), (b, a)):
                    if x == v and y != removed and y not in reached:
                        reached.add(y)
                        frontier.append(y)
        return "sink" in reached

    return [v for v in vertices if connected(None) and not connected(v)]


@pytest.mark.parametrize("n", [1, 2, 5, 16])
def test_linear_graph_has_2n_plus_1_nodes(n: int) -> None:
    graph = linear_graph(n)
    assert graph.size == 2 * n + 1
    assert forward_nodes(graph) == list(range(n))


@pytest.mark.parametrize("graph", [linear_graph(7), UNET, *BRANCHING], ids=lambda g: f"T{g.size}")
def test_checkpoint_all_costs_exactly_the_sum_of_costs(graph: Graph) -> None:
    plan = solve(graph, None, method="checkpoint_all")
    assert plan.cost == pytest.approx(sum(node.cost for node in graph.nodes))


@pytest.mark.parametrize("method", BASELINES)
@pytest.mark.parametrize("graph", [linear_graph(9), UNET, *BRANCHING], ids=lambda g: f"T{g.size}")
def test_every_baseline_is_feasible_at_its_own_peak_and_matches_the_paper_model(graph: Graph, method: str) -> None:
    plan = solve(graph, None, method=method)
    check_plan(graph, plan.R, plan.S)
    assert (plan.cost, plan.peak_memory) == pytest.approx(paper_cost_and_peak(graph, plan.R, plan.S))
    again = solve(graph, plan.peak_memory, method=method)
    assert again.peak_memory <= plan.peak_memory
    with pytest.raises(InfeasibleBudget) as caught:
        solve(graph, 0, method=method)
    assert caught.value.minimum is not None and caught.value.minimum > 0


@pytest.mark.parametrize("graph", [linear_graph(1), linear_graph(6), UNET, *BRANCHING], ids=lambda g: f"T{g.size}")
def test_articulation_points_match_brute_force(graph: Graph) -> None:
    assert articulation_points(graph) == brute_force_cut_vertices(graph)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.lists(st.integers(0, 30), max_size=3), min_size=1, max_size=14))
def test_articulation_points_match_brute_force_on_random_forward_graphs(raw_inputs: list[list[int]]) -> None:
    # Node j reads the drawn indices below j: some nodes read nothing, and some are not read on the way to the loss.
    forward_inputs = [sorted({i % j for i in inputs}) if j else [] for j, inputs in enumerate(raw_inputs)]
    graph = training_graph(forward_inputs)
    assert articulation_points(graph) == brute_force_cut_vertices(graph)


def test_articulation_points_of_a_unet_are_only_its_ends() -> None:
    assert articulation_points(UNET) == [0, 7]


def test_articulation_point_variants_reproduce_the_linearised_ones_on_chains() -> None:
    graph = linear_graph(12)
    assert articulation_points(graph) == forward_nodes(graph)
    for name in ("chen_sqrtn", "chen_greedy"):
        plan, linear = solve(graph, 12, method=name), solve(graph, 12, method=f"{name}_linear")
        assert np.array_equal(plan.S, linear.S) and np.array_equal(plan.R, linear.R)


def test_every_kth_and_greedy_rules_on_hand_worked_examples() -> None:
    assert every_kth(list(range(9)), 3) == [2, 5, 8]
    assert every_kth([4, 7], 0) == []
    graph = training_graph([[], [0], [1], [2], [3]], memory=[3, 1, 1, 4, 2])
    # Running totals 3, 4 (> 3: checkpoint 1, reset), 1, 5 (> 3: checkpoint 3, reset), 2.
    assert greedy_checkpoints(graph, [0, 1, 2, 3, 4], 3) == [1, 3]
    # Only even nodes allowed: 3 at node 0 (not > 3), 5 at node 2 (checkpoint), then 4, 6 at node 4 (checkpoint).
    assert greedy_checkpoints(graph, [0, 2, 4], 3) == [2, 4]
    assert greedy_checkpoints(graph, [0, 2, 4], 5) == [4]
    assert greedy_checkpoints(graph, [0, 2, 4], 11) == []


@pytest.mark.parametrize("n,every", [(9, 3), (12, 4), (10, 3)])
def test_checkpoint_s_recomputes_each_segment_once_on_chains(n: int, every: int) -> None:
    graph = linear_graph(n)
    checkpoints = list(range(every - 1, n, every))
    plan = solve(graph, None, method="checkpoint_all")
    fixed = plan_from_s(graph, checkpoint_s(graph, checkpoints), method="test")
    computed = fixed.R.sum(axis=0)
    final_segment = set(range(checkpoints[-1] + 1, n))
    for node in range(n):
        expected = 1 if node in checkpoints or node in final_segment else 2
        assert computed[node] == expected, f"forward node {node}"
    assert (computed[n:] == 1).all(), "backward nodes run once"
    # Peak: the checkpoints plus one segment plus a few gradients, well under checkpoint_all's n + 2.
    assert fixed.peak_memory <= len(checkpoints) + every + 3 < plan.peak_memory


def test_chen_sqrtn_peak_grows_like_sqrt_n_and_checkpoint_all_like_n() -> None:
    sizes = [16, 64, 144]
    sqrtn = [solve(linear_graph(n), None, method="chen_sqrtn") for n in sizes]
    every = [solve(linear_graph(n), None, method="checkpoint_all") for n in sizes]
    for n, plan, reference in zip(sizes, sqrtn, every, strict=True):
        assert reference.peak_memory == n + 2
        assert 1.5 <= plan.peak_memory / math.sqrt(n) <= 2.5
        assert plan.cost <= reference.cost + n, "at most one extra forward pass"


def test_greedy_cost_never_rises_with_the_budget() -> None:
    graph = BRANCHING[2]
    with pytest.raises(InfeasibleBudget) as caught:
        chen_greedy_linear(graph, 0)
    lowest = caught.value.minimum
    assert lowest is not None
    highest = solve(graph, None, method="checkpoint_all").peak_memory
    costs = [chen_greedy_linear(graph, budget).cost for budget in range(lowest, highest + 1, 7)]
    assert costs == sorted(costs, reverse=True)


def test_greedy_returns_the_cheapest_of_its_checkpoint_sets_within_the_budget() -> None:
    graph = BRANCHING[1]
    candidates = forward_nodes(graph)
    budgets = [0.0, 5.0, 10.0, 20.0, 40.0]
    plans = [
        plan_from_s(graph, checkpoint_s(graph, greedy_checkpoints(graph, candidates, b)), method="t") for b in budgets
    ]
    limit = sorted(plan.peak_memory for plan in plans)[2]
    expected = min(plan.cost for plan in plans if plan.peak_memory <= limit)
    chosen = greedy_plan(graph, limit, candidates=candidates, method="t", segment_budgets=budgets)
    assert chosen.cost == expected and chosen.peak_memory <= limit


def griewank_forward_steps(steps: int, snapshots: int) -> int:
    """Griewank (1992): fewest forward steps to reverse `steps` steps with `snapshots` snapshots, t·l − β(s+1, t−1)."""
    repetitions = 0
    while math.comb(snapshots + repetitions, snapshots) < steps:
        repetitions += 1
    return repetitions * steps - math.comb(snapshots + repetitions, snapshots + 1)


@functools.cache
def recursive_reversal_cost(length: int, slots: int) -> int:
    """Recomputations to reverse `length` chain values from a held base value, by exhaustive search over the split
    recursion: advance `split` values, snapshot the last, reverse the rest with a slot less, then the first part."""
    if length == 0:
        return 0
    if slots == 0 or length == 1:
        return length * (length + 1) // 2
    splits = [
        split + recursive_reversal_cost(length - split, slots - 1) + recursive_reversal_cost(split - 1, slots)
        for split in range(1, length)
    ]
    return min([recursive_reversal_cost(length, slots - 1), *splits])


def test_the_split_recursion_reaches_griewanks_binomial_count() -> None:
    for length in range(1, 31):
        for slots in range(7):
            # A piece of `length` values with its base held is revolve on length + 1 states with one more snapshot.
            assert recursive_reversal_cost(length, slots) == griewank_forward_steps(length + 1, slots + 1)


@pytest.mark.parametrize("n", [1, 2, 5, 9, 16])
def test_griewank_plan_cost_is_the_binomial_optimum(n: int) -> None:
    graph = linear_graph(n)
    for slots in range(n):
        plan = revolve_plan(graph, slots)
        check_plan(graph, plan.R, plan.S)
        # The forward pass is paid anyway: 2n + 1 stages plus the revolve steps beyond the first n.
        assert plan.cost == 2 * n + 1 + griewank_forward_steps(n + 1, slots + 1) - n
        assert plan.peak_memory <= slots + 3


@pytest.mark.parametrize("n", [4, 9, 16, 25])
def test_griewank_is_no_dearer_than_chen_sqrtn_at_its_peak(n: int) -> None:
    graph = linear_graph(n)
    chen = chen_sqrtn(graph, None)
    revolve = griewank(graph, chen.peak_memory)
    assert revolve.peak_memory <= chen.peak_memory and revolve.cost <= chen.cost


def test_griewank_with_enough_slots_is_checkpoint_all() -> None:
    graph = linear_graph(8)
    reference = solve(graph, None, method="checkpoint_all")
    for slots in (8, 20):
        assert solve(graph, None, method="griewank", slots=slots).cost == reference.cost
    assert solve(graph, None, method="griewank").cost == reference.cost


def test_griewank_picks_the_most_slots_within_the_budget() -> None:
    graph = linear_graph(20)
    every_slot_count = [revolve_plan(graph, slots) for slots in range(20)]
    for budget in (3, 5, 8, 13):
        plan = griewank(graph, budget)
        assert plan.cost == min(p.cost for p in every_slot_count if p.peak_memory <= budget)
    with pytest.raises(InfeasibleBudget):
        griewank(graph, 2)


def test_griewank_accepts_a_chain_whose_gradients_read_their_inputs() -> None:
    graph = training_graph([[], [0], [1], [2], [3], [4]])
    plan = solve(graph, None, method="griewank", slots=2)
    assert (plan.cost, plan.peak_memory) == pytest.approx(paper_cost_and_peak(graph, plan.R, plan.S))


@pytest.mark.parametrize("graph", [UNET, BRANCHING[0], Graph((Node("a", 1, 1), Node("b", 1, 1, True, (0,))))])
def test_griewank_refuses_graphs_that_are_not_chains(graph: Graph) -> None:
    with pytest.raises(MethodNotApplicable, match="chen_sqrtn_linear"):
        solve(graph, None, method="griewank")


@pytest.mark.parametrize("method", ["checkpoint_all", "chen_sqrtn", "chen_greedy", "griewank", "optimal", "approx"])
def test_every_method_raises_infeasible_budget_itself(method: str) -> None:
    """The methods say "does not fit" themselves: `solve` no longer turns an over-budget plan into that answer."""
    graph = linear_graph(6)
    floor = solve(graph, None, method="checkpoint_all").peak_memory // 4
    with pytest.raises(InfeasibleBudget):
        call_strategy(method, graph, floor, {"time_limit": 5} if method in ("optimal", "approx") else {})


def test_an_over_budget_plan_from_a_method_is_a_bug_not_an_infeasible_budget(monkeypatch: pytest.MonkeyPatch) -> None:
    graph = linear_graph(4)
    over = solve(graph, None, method="checkpoint_all")
    broken = Strategy("checkpoint_all", "returns its plan whatever the budget", lambda graph, budget: over)
    monkeypatch.setitem(registry._STRATEGIES, "checkpoint_all", broken)
    with pytest.raises(InvalidSchedule, match="internal error: checkpoint_all returned a plan"):
        solve(graph, over.peak_memory - 1, method="checkpoint_all")


def test_the_greedy_baseline_on_a_stopped_clock_prices_and_simulates_one_checkpoint_set(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A search's clock that has run out stops Chen's greedy rule after its first value of b: one set priced, one plan
    simulated, the plan of the first b (before, all 60 sets were priced, about 0.8 s on a 901-node graph, past the
    caller's time limit)."""
    graph = random_training_graph(60, seed=2)
    priced: list[np.ndarray] = []
    cheapest_r = chen.cheapest_r

    def counted_r(graph: Graph, S: np.ndarray) -> np.ndarray:
        priced.append(S)
        return cheapest_r(graph, S)

    monkeypatch.setattr(chen, "cheapest_r", counted_r)
    plan = chen_greedy_linear(graph, None, control=SearchControl(time_limit=0.0))
    first_b = chen.default_segment_budgets(graph)[0]
    first = plan_from_s(
        graph, checkpoint_s(graph, greedy_checkpoints(graph, forward_nodes(graph), first_b)), method="x"
    )
    assert len(priced) == 1
    np.testing.assert_array_equal(plan.S, first.S)
    assert plan.cost == first.cost
