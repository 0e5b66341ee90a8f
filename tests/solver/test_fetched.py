"""Fetched values (an FSDP2 unit's parameters) in the plan: the MILP against an exhaustive oracle, its encoding against
the simulator, and a plan that fetches a value twice because the budget requires it."""

from __future__ import annotations

import dataclasses
import itertools
from typing import Any

import numpy as np
import pytest
from exhaustive import fewest_computations, useful_entries
from oracles import least_waits, paper_cost_and_peak

from checkmate.errors import InfeasibleBudget, InvalidSchedule
from checkmate.examples import linear_graph, random_training_graph, training_graph
from checkmate.fetched import FetchedValue, default_presence, fetches
from checkmate.graph import Graph
from checkmate.milp.formulation import decode, decode_presence, encode, encode_solution
from checkmate.milp.scaling import memory_scale
from checkmate.plan import cheapest_r, make_plan
from checkmate.simulate import lower
from checkmate.solve import solve


def _unit(graph: Graph, name: str, readers: tuple[int, ...], memory: int, cost: float, **rules: Any) -> FetchedValue:
    backward_start = int(np.flatnonzero(graph.is_backward)[0])
    return FetchedValue(name, memory, readers, cost, last_use=max(readers), backward_start=backward_start, **rules)


def _chain_with_unit(n: int, memory: int, cost: float, **rules: Any) -> Graph:
    """The paper's chain with one unit read by forward node 0 and 1 and by their gradients (a block's weights)."""
    graph = linear_graph(n)
    T = graph.size
    return dataclasses.replace(graph, fetched=(_unit(graph, "block", (0, 1, T - 2, T - 1), memory, cost, **rules),))


def _valid(graph: Graph, R: np.ndarray, presence: np.ndarray) -> bool:
    """The rules of `checkmate.fetched`, written again over the columns."""
    T = graph.size
    for column, value in enumerate(graph.fetched):
        present = presence[:, column]
        reads = R[:, list(value.readers)].any(axis=1)
        end = max([value.last_use, *np.flatnonzero(reads)])
        if (reads & ~present).any() or present[end + 1 :].any() or not present[end]:
            return False
        tail = present[value.backward_start : end + 1].astype(int)
        if (np.diff(tail) < 0).any():
            return False
        if value.kept and not present[min(value.readers) : end + 1].all():
            return False
        if value.released_before_backward and value.backward_start < T and present[value.backward_start]:
            return False
    return True


def _oracle(graph: Graph, budget: int) -> float | None:
    """The cheapest plan within `budget` by exhaustive search over S (the fewest computations each allows) and every
    presence, priced by the paper's equations with the present bytes (on a graph that prefetches, and the bytes and
    in-flight workspace of each value fetched in the next stage) as the stage's held memory, each fetch's workspace
    at its stage's start, and each fetch at its cost (with releases, the least wait of the link's slots as a linear
    program, `oracles.least_waits`): nothing from the library's planning code."""
    T, F = graph.size, len(graph.fetched)
    plain = dataclasses.replace(graph, fetched=())
    sizes = np.array([value.memory for value in graph.fetched])
    fetching = np.array([value.fetch_workspace for value in graph.fetched])
    in_flight = np.array([value.in_flight_workspace for value in graph.fetched])
    costs = np.array([value.fetch_cost for value in graph.fetched])
    entries = useful_entries(plain)
    best = None
    for bits in itertools.product((False, True), repeat=len(entries)):
        S = np.zeros((T, T), dtype=bool)
        for (t, i), bit in zip(entries, bits, strict=True):
            S[t, i] = bit
        R = fewest_computations(plain, S)
        for presence_bits in itertools.product((False, True), repeat=T * F):
            presence = np.array(presence_bits, dtype=bool).reshape(T, F)
            if not _valid(graph, R, presence):
                continue
            rises = presence & ~np.vstack([np.zeros((1, F), dtype=bool), presence[:-1]])
            ahead = np.vstack([rises[1:], np.zeros((1, F), dtype=bool)]) & graph.prefetch
            stage_bytes = (presence | ahead).astype(int) @ sizes + ahead @ in_flight
            opening_bytes = rises.astype(int) @ fetching
            held = dataclasses.replace(
                plain,
                stage_held=tuple(int(b) for b in stage_bytes),
                opening_held=tuple(int(b) for b in opening_bytes),
            )
            cost, peak = paper_cost_and_peak(held, R, S)
            compute = [sum(node.cost if i == t else (node.recompute_cost or node.cost)
                           for i, node in enumerate(graph.nodes) if R[t, i]) for t in range(T)]  # fmt: skip
            if any(value.release_cost for value in graph.fetched):  # the link's least wait, by linear programming
                jobs = [(0, float(costs[v]), t, t) for t, v in zip(*np.nonzero(rises), strict=True)]
                ends = [int(np.flatnonzero(presence[:, v])[-1]) for v in range(F)]
                jobs += [
                    (0, value.release_cost, end + 2, T + 1) for value, end in zip(graph.fetched, ends, strict=True)
                ]
                cost += least_waits(jobs, [graph.fetch_overlap * c for c in [0.0, *compute, 0.0]])
            else:  # each stage's fetches, less what the stage before's compute hides
                cost += sum(max(0.0, float(costs @ rises[t]) - graph.fetch_overlap * ([0.0, *compute][t]))
                            for t in range(T))  # fmt: skip
            if peak <= budget and (best is None or cost < best - 1e-9):
                best = cost
    return best


def _released_early(graph: Graph) -> Graph:
    """`graph` (a chain) with one unit read by its second forward node and that node's gradient, released (at a cost
    of 2) after it, before the step's last stage."""
    T = graph.size
    return dataclasses.replace(graph, fetched=(_unit(graph, "block", (1, T - 2), 2, 1.5, release_cost=2.0),))


ORACLE_GRAPHS = {
    "chain": _chain_with_unit(2, memory=2, cost=1.5),
    "chain, kept": _chain_with_unit(2, memory=2, cost=1.5, kept=True),
    "chain, released before backward": _chain_with_unit(2, memory=3, cost=0.5, released_before_backward=True),
    "chain, prefetched": dataclasses.replace(_chain_with_unit(2, memory=2, cost=1.5), prefetch=True),
    "chain, overlapped": dataclasses.replace(_chain_with_unit(2, memory=2, cost=1.5), fetch_overlap=0.5, prefetch=True),
    "chain, fetch workspace": _chain_with_unit(2, memory=2, cost=0.5, fetch_workspace=2),
    "chain, prefetched with workspaces": dataclasses.replace(
        _chain_with_unit(2, memory=2, cost=0.5, fetch_workspace=1, in_flight_workspace=2), prefetch=True
    ),
    "chain, released": _chain_with_unit(2, memory=2, cost=1.5, release_cost=1.0),
    "chain, released beside the last stages": dataclasses.replace(
        _released_early(linear_graph(2)), fetch_overlap=0.5, prefetch=True
    ),
}


@pytest.mark.parametrize("name", ORACLE_GRAPHS)
def test_the_milp_finds_the_exhaustive_optimum_with_fetched_values(name: str) -> None:
    graph = ORACLE_GRAPHS[name]
    no_remat = solve(graph, None, method="checkpoint_all")
    for budget in range(no_remat.peak_memory, 0, -1):
        expected = _oracle(graph, budget)
        if expected is None:
            with pytest.raises(InfeasibleBudget):
                solve(graph, budget, method="optimal", time_limit=30)
            break
        plan = solve(graph, budget, method="optimal", time_limit=30)
        assert plan.peak_memory <= budget
        assert plan.cost == pytest.approx(expected), budget


def _with_units(graph: Graph) -> Graph:
    """`graph` with two units: one read by the first forward nodes and their gradients, one by the next ones."""
    T = graph.size
    forward = int(np.flatnonzero(graph.is_backward)[0]) - 1  # forward nodes before the loss
    first = tuple(range(forward // 2))
    second = tuple(range(forward // 2, forward))
    gradient = {j: T - 1 - j for j in range(forward)}  # the gradient node of forward node j (training_graph order)
    return dataclasses.replace(
        graph,
        fetched=(
            _unit(graph, "first", (*first, *(gradient[j] for j in first)), 5, 2.0),
            _unit(graph, "second", (*second, *(gradient[j] for j in second)), 3, 1.0),
        ),
    )


def _with_workspaces(graph: Graph) -> Graph:
    """`graph` whose fetches hold more than their values: 3 bytes beside each, 2 beside each buffer in flight."""
    values = tuple(dataclasses.replace(value, fetch_workspace=3, in_flight_workspace=2) for value in graph.fetched)
    return dataclasses.replace(graph, fetched=values)


def _with_releases(graph: Graph) -> Graph:
    """`graph` whose values are each handed back after their end at 1.5 and 2.5 (FSDP2's reduce-scatters)."""
    costs = (1.5, 2.5)
    values = tuple(
        dataclasses.replace(value, release_cost=cost) for value, cost in zip(graph.fetched, costs, strict=True)
    )
    return dataclasses.replace(graph, fetched=values)


FEASIBLE_GRAPHS = [
    _with_units(linear_graph(5)),
    _with_units(random_training_graph(6, seed=3)),
    dataclasses.replace(_with_units(random_training_graph(6, seed=4)), fetch_overlap=0.3, prefetch=True),
    dataclasses.replace(_with_units(random_training_graph(6, seed=5)), prefetch=True),
    _with_workspaces(_with_units(random_training_graph(6, seed=6))),
    dataclasses.replace(_with_workspaces(_with_units(random_training_graph(6, seed=7))), prefetch=True),
    _with_releases(_with_units(random_training_graph(6, seed=8))),
    dataclasses.replace(
        _with_releases(_with_units(random_training_graph(6, seed=9))), fetch_overlap=0.6, prefetch=True
    ),
]


@pytest.mark.parametrize(
    "graph",
    FEASIBLE_GRAPHS,
    ids=[
        "chain",
        "random",
        "overlapped",
        "prefetched",
        "workspaces",
        "prefetched workspaces",
        "released",
        "released, overlapped",
    ],
)
def test_valid_plans_with_presences_are_feasible_points_with_the_simulated_cost_and_peak(graph: Graph) -> None:
    scale = memory_scale(graph)
    rng = np.random.default_rng(graph.size)
    for density in np.linspace(0.0, 1.0, 8):
        S = np.tril(rng.random((graph.size, graph.size)) < density, -1)
        R = cheapest_r(graph, S)
        _, index = encode(graph, np.inf, scale)
        R, S = decode(encode_solution(graph, index, R, S), index)
        if any(R[value.last_use + 1 :, list(value.readers)].any() for value in graph.fetched):
            continue  # a reader run after the value's last use: a plan, but not one of the MILP's (its restriction)
        for presence in (default_presence(graph.fetched, R), _held_through(graph, R)):
            schedule = lower(graph, R, S, presence)
            budget = scale.budget_units(schedule.peak_memory, graph.fixed_memory)
            problem, index = encode(graph, budget, scale)
            x = encode_solution(graph, index, R, S, presence)
            assert problem.max_violation(x) < 1e-9
            assert problem.c @ x == pytest.approx(schedule.cost)
            assert (decode_presence(x, index) == presence).all()
            tighter, _ = encode(graph, budget - 1, scale)
            assert tighter.max_violation(x) >= 1.0 - 1e-9


def _held_through(graph: Graph, R: np.ndarray) -> np.ndarray:
    """Each value present from its first read to its last use: fetched once."""
    presence = default_presence(graph.fetched, R)
    for column, value in enumerate(graph.fetched):
        presence[min(value.readers) : value.last_use + 1, column] = True
    return presence


def test_the_budget_decides_between_holding_a_unit_and_fetching_it_again() -> None:
    """A unit held from forward to backward costs one fetch; at less memory the plan frees it after the forward and
    fetches it again (two fetches) rather than recompute; at less still, it recomputes too."""
    graph = _chain_with_unit(4, memory=4, cost=0.5)
    loose = solve(graph, None, method="optimal", time_limit=30)
    assert fetches(loose.presence).tolist() == [1] and not loose.recomputes
    held_peak = loose.peak_memory
    again = solve(graph, held_peak - 1, method="optimal", time_limit=30)
    assert fetches(again.presence).tolist() == [2] and not again.recomputes
    assert again.cost == pytest.approx(loose.cost + 0.5)
    floor = again.peak_memory - 1
    tight = solve(graph, floor, method="optimal", time_limit=30)
    assert tight.recomputes and tight.peak_memory <= floor


def test_a_hold_is_bought_with_recomputation_where_a_fetch_costs_more() -> None:
    """The same memory as the plan that fetches the unit twice above, but each fetch now costs more than recomputing
    a node (10 against 1): the plan keeps the unit from forward to backward and recomputes to make room for it."""
    graph = _chain_with_unit(4, memory=4, cost=10.0)
    held_peak = solve(graph, None, method="optimal", time_limit=30).peak_memory
    plan = solve(graph, held_peak - 1, method="optimal", time_limit=30)
    assert fetches(plan.presence).tolist() == [1] and plan.recomputes
    assert plan.status == "optimal"


@pytest.mark.parametrize("workspace", [0, 3])
def test_the_coarse_path_plans_fetched_values_within_the_budget(workspace: int) -> None:
    """Through a coarse graph (`exact_nodes` below the graph's size), the plan fits, and holds the unit from forward
    to backward where the coarse plan did: no more fetches than FSDP2's presence of the same budget's baseline; also
    where each fetch holds 3 bytes beside the unit, which the expanded plan's simulated peak counts at its fetches."""
    graph = _chain_with_unit(12, memory=4, cost=10.0, fetch_workspace=workspace)
    no_remat = solve(graph, None, method="checkpoint_all")
    budget = no_remat.peak_memory - 2
    plan = solve(graph, budget, method="optimal", time_limit=20, exact_nodes=10, coarse_nodes=8)
    assert plan.peak_memory <= budget
    assert fetches(plan.presence).tolist() == [1] and plan.recomputes


def test_the_coarse_path_prices_a_release_beside_compute() -> None:
    """Through a coarse graph, a unit read by the second forward node and its gradient, released after that gradient
    (at 5, the link hiding half of each stage's compute): the plan fits, and its cost is the same plan's on the graph
    without the release plus the release less at most what the last stage's compute (1) hides of it (0.5)."""
    chain = linear_graph(12)
    T = chain.size
    unit = _unit(chain, "block", (1, T - 2), 4, 10.0, release_cost=5.0)
    graph = dataclasses.replace(chain, fetched=(unit,), fetch_overlap=0.5, prefetch=True)
    budget = solve(graph, None, method="checkpoint_all").peak_memory - 2
    plan = solve(graph, budget, method="optimal", time_limit=20, exact_nodes=10, coarse_nodes=8)
    assert plan.peak_memory <= budget
    without = dataclasses.replace(graph, fetched=(dataclasses.replace(unit, release_cost=0.0),))
    added = plan.cost - lower(without, plan.R, plan.S, plan.presence).cost
    assert 4.5 - 1e-9 <= added <= 5.0 + 1e-9


def test_a_presence_that_breaks_a_rule_is_refused() -> None:
    graph = _chain_with_unit(2, memory=2, cost=1.0)
    plan = solve(graph, None, method="checkpoint_all")
    missing = plan.presence.copy()
    missing[0, 0] = False
    with pytest.raises(InvalidSchedule, match="read in stage 0"):
        make_plan(graph, plan.R, plan.S, method="test", presence=missing)
    kept = dataclasses.replace(graph, fetched=(dataclasses.replace(graph.fetched[0], kept=True),))
    with pytest.raises(InvalidSchedule, match="kept"):
        make_plan(kept, plan.R, plan.S, method="test", presence=plan.presence)


def test_the_graph_file_keeps_its_fetched_values() -> None:
    graph = dataclasses.replace(_with_units(training_graph([[], [0], [1], [2]])), fetch_overlap=0.25, prefetch=True)
    assert Graph.from_json(graph.to_json()) == graph
    assert Graph.from_json(_with_workspaces(graph).to_json()) == _with_workspaces(graph)
    assert Graph.from_json(_with_releases(graph).to_json()) == _with_releases(graph)


def test_a_fetch_workspace_is_counted_where_the_plan_fetches() -> None:
    """The unit fetched again for the backward fits 9 bytes when fetches hold nothing beside it; a fetch that holds 3
    bytes more (FSDP2's flat all-gather buffer) puts them at the start of the backward stage that fetches it again,
    above the budget (2 bytes more would still fit there), so the plan holds the unit from forward to backward and
    recomputes to make room instead."""
    light = _chain_with_unit(4, memory=4, cost=0.5)
    again = solve(light, 9, method="optimal", time_limit=30)
    assert fetches(again.presence).tolist() == [2] and not again.recomputes
    heavy = _chain_with_unit(4, memory=4, cost=0.5, fetch_workspace=3)
    priced = make_plan(heavy, again.R, again.S, method="test", presence=again.presence)
    assert priced.peak_memory > 9, "the workspace counts at the second fetch"
    plan = solve(heavy, 9, method="optimal", time_limit=30)
    assert fetches(plan.presence).tolist() == [1] and plan.recomputes
    assert plan.peak_memory <= 9 and plan.status == "optimal"
