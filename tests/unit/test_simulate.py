import dataclasses

import numpy as np
import pytest
from oracles import (
    paper_cost_and_peak,
    random_valid_s,
    replay_peak,
    with_opening_held,
    with_retained,
    with_stage_held,
    with_workspace,
)

from checkmate import Graph, InvalidSchedule, cheapest_r, check_plan, lower, simulate
from checkmate.examples import linear_graph, random_training_graph
from checkmate.strategies.checkpoint_all import checkpoint_all_s

GRAPHS = [linear_graph(1), linear_graph(4), linear_graph(9)] + [random_training_graph(n, seed=n) for n in (3, 6, 11)]
GRAPHS += [with_workspace(graph, seed=index) for index, graph in enumerate(GRAPHS[2:])]
GRAPHS += [with_retained(graph, seed=index) for index, graph in enumerate(GRAPHS[-3:])]
GRAPHS += [with_stage_held(graph, seed=index) for index, graph in enumerate(GRAPHS[-2:])]
GRAPHS += [with_opening_held(graph, seed=index, largest=150) for index, graph in enumerate(GRAPHS[-3:])]


def _label(graph: Graph) -> str:
    flags = [
        name for name, present in (("workspace", graph.workspace.any()), ("retained", graph.retained.any()),
                                   ("stage-held", bool(graph.stage_held)),
                                   ("opening-held", bool(graph.opening_held))) if present
    ]  # fmt: skip
    return "-".join([f"T{graph.size}", *flags])


@pytest.mark.parametrize("graph", GRAPHS, ids=_label)
def test_simulator_matches_the_paper_equations_and_the_replayed_steps(graph) -> None:
    rng = np.random.default_rng(graph.size)
    for density in (0.0, 0.2, 0.5, 0.9):
        S = random_valid_s(graph, rng, density)
        R = cheapest_r(graph, S)
        cost, peak = simulate(graph, R, S)
        assert (cost, peak) == pytest.approx(paper_cost_and_peak(graph, R, S))
        assert replay_peak(graph, lower(graph, R, S).steps) == peak


def test_simulator_counts_a_recomputed_held_value_twice_like_the_paper() -> None:
    graph = linear_graph(2)
    S = checkpoint_all_s(graph)
    R = cheapest_r(graph, S)
    R[3, 1] = True
    R[3, 0] = True
    assert simulate(graph, R, S) == pytest.approx(paper_cost_and_peak(graph, R, S))
    assert replay_peak(graph, lower(graph, R, S).steps) == simulate(graph, R, S)[1]


def test_checkpoint_all_on_a_chain_costs_the_sum_and_holds_every_forward_value() -> None:
    n = 8
    graph = linear_graph(n)
    S = checkpoint_all_s(graph)
    cost, peak = simulate(graph, cheapest_r(graph, S), S)
    assert cost == graph.costs.sum()
    assert peak == n + 2


def test_fixed_memory_is_added_to_the_peak() -> None:
    graph = random_training_graph(5, seed=1)
    heavier = type(graph)(graph.nodes, fixed_memory=1000)
    S = checkpoint_all_s(graph)
    R = cheapest_r(graph, S)
    assert simulate(heavier, R, S)[1] == simulate(graph, R, S)[1] + 1000


def test_workspace_counts_only_while_its_node_runs() -> None:
    chain = linear_graph(3)
    S = checkpoint_all_s(chain)
    R = cheapest_r(chain, S)
    base = lower(chain, R, S)
    loaded = Graph((chain.nodes[0], dataclasses.replace(chain.nodes[1], workspace=100), *chain.nodes[2:]))
    schedule = lower(loaded, R, S)
    computes = [step.node for step in base.steps if type(step).__name__ == "Compute"]
    assert [u - b for u, b in zip(schedule.usage, base.usage, strict=True)] == [100 * (node == 1) for node in computes]
    assert schedule.peak_memory == max(base.usage[computes.index(1)] + 100, base.peak_memory)


def test_recompute_workspace_counts_only_when_a_later_stage_runs_the_node() -> None:
    chain = linear_graph(2)
    nothing = np.zeros((chain.size, chain.size), dtype=bool)
    R = cheapest_r(chain, nothing)
    loaded = Graph((dataclasses.replace(chain.nodes[0], workspace=10, recompute_workspace=1000), *chain.nodes[1:]))
    base, schedule = lower(chain, R, nothing), lower(loaded, R, nothing)
    computes = [step for step in base.steps if type(step).__name__ == "Compute"]
    extra = [10 if step.stage == 0 else 1000 if step.node == 0 else 0 for step in computes]
    assert R[1:, 0].any(), "the plan must recompute node 0"
    assert [u - b for u, b in zip(schedule.usage, base.usage, strict=True)] == extra


def _valid_plan(n: int = 3) -> tuple:
    graph = linear_graph(n)
    S = checkpoint_all_s(graph)
    return graph, cheapest_r(graph, S), S


@pytest.mark.parametrize(
    ("edit", "constraint"),
    [
        (lambda R, S: R.__setitem__((2, 2), False), "(8a)"),
        (lambda R, S: R.__setitem__((1, 3), True), "(8c)"),
        (lambda R, S: S.__setitem__((1, 1), True), "(8b)"),
        (
            lambda R, S: (S.__setitem__((4, 0), True), S.__setitem__((3, 0), False), R.__setitem__((3, 0), False)),
            "(1c)",
        ),
        (lambda R, S: S.__setitem__((5, 1), False), "(1b)"),
    ],
)
def test_broken_constraints_are_named(edit, constraint: str) -> None:
    graph, R, S = _valid_plan()
    check_plan(graph, R, S)
    edit(R, S)
    with pytest.raises(InvalidSchedule) as caught:
        simulate(graph, R, S)
    assert str(caught.value).startswith(constraint)


def test_wrong_shape_or_values_are_rejected() -> None:
    graph, R, S = _valid_plan()
    with pytest.raises(InvalidSchedule, match="shape"):
        simulate(graph, R[:-1], S)
    with pytest.raises(InvalidSchedule, match="0 and 1"):
        simulate(graph, R * 2, S)
