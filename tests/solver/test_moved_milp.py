"""Moves to host memory in the MILP (`checkmate.milp.moves`): every valid plan with moves is a feasible point with
its simulated cost, and the search moves values where the link is cheap and recomputes where it is dear."""

from __future__ import annotations

import dataclasses
import itertools

import numpy as np
import pytest
from exhaustive import useful_entries
from oracles import moved_cost_and_usage, moved_everywhere_but_reads

from checkmate.errors import InfeasibleBudget
from checkmate.examples import linear_graph, random_training_graph
from checkmate.graph import Graph
from checkmate.milp.formulation import decode_plan_moves, encode, encode_solution
from checkmate.milp.scaling import memory_scale
from checkmate.moved import HostLink, Moves
from checkmate.simulate import lower
from checkmate.solve import solve

FAST = HostLink(to_host_per_byte=0.1, to_device_per_byte=0.1, latency=0.0, overlap=1.0)
SLOW = HostLink(to_host_per_byte=5.0, to_device_per_byte=5.0, latency=1.0, overlap=0.2)


@pytest.mark.parametrize("seed", range(4))
def test_valid_plans_with_moves_are_feasible_points_with_the_simulated_cost(seed: int) -> None:
    rng = np.random.default_rng(seed)
    link = HostLink(
        float(rng.uniform(0, 0.2)), float(rng.uniform(0, 0.2)), float(rng.uniform(0, 1)), float(rng.uniform(0, 1))
    )
    graph = dataclasses.replace(random_training_graph(6, seed=seed), host_link=link)
    scale = memory_scale(graph)
    checked = 0
    for method, node, after_a_read in itertools.product(("checkpoint_all", "chen_sqrtn"), range(6), (False, True)):
        plan = solve(graph, None, method=method)
        if graph.nodes[node].backward or plan.R[:, node].sum() > 1:
            continue
        S, moves = moved_everywhere_but_reads(graph, plan.R, plan.S, node, after_a_read=after_a_read)
        if not moves.copy_in.any():
            continue
        schedule = lower(graph, plan.R, S, moves=moves)
        budget = scale.budget_units(schedule.peak_memory, graph.fixed_memory)
        problem, index = encode(graph, budget, scale)
        x = encode_solution(graph, index, plan.R, S, moves=moves)
        assert problem.max_violation(x) < 1e-9, (method, node, after_a_read)
        assert problem.c @ x == pytest.approx(schedule.cost)
        assert problem.c @ x == pytest.approx(moved_cost_and_usage(graph, plan.R, S, moves)[0])
        decoded = decode_plan_moves(x, index)
        assert (decoded.copy_out == moves.copy_out).all() and (decoded.copy_in == moves.copy_in).all()
        tighter, _ = encode(graph, budget - 1, scale)
        assert tighter.max_violation(x) >= 1.0 - 1e-9
        checked += 1
    assert checked > 0


def _chain(link: HostLink | None) -> Graph:
    return dataclasses.replace(linear_graph(6), host_link=link)


@pytest.mark.parametrize("budget", [5, 4])
def test_a_cheap_link_moves_values_instead_of_recomputing_them(budget: int) -> None:
    """On the paper's chain of 6 below its no-recomputation peak, copies that compute hides cost nothing: the joint
    plan runs every node once and moves what it cannot hold; with a dear link it recomputes as the plan without a
    link does. Both proven optimal, and within the budget as simulated."""
    alone = solve(_chain(None), budget, method="optimal", time_limit=30, progress=False)
    assert alone.recomputes
    moving = solve(_chain(FAST), budget, method="optimal", time_limit=30, progress=False)
    assert moving.moves.any and not moving.recomputes
    assert moving.cost == pytest.approx(_chain(FAST).least_cost) and moving.status == "optimal"
    assert moving.peak_memory <= budget and moving.host_peak > 0
    dear = solve(_chain(SLOW), budget, method="optimal", time_limit=30, progress=False, mip_gap=1e-7)
    assert dear.cost == pytest.approx(alone.cost) and dear.status == "optimal"
    assert not dear.moves.any


def _fewest_computations(graph: Graph, S: np.ndarray, copied_in: np.ndarray) -> np.ndarray:
    """The smallest R meeting (8a), (1b) and (1c) with copied-in values as a source: per stage, node t and what is
    held into the next stage without being on the device, closed over inputs that are not."""
    T = graph.size
    on_device = S | copied_in
    R = np.zeros((T, T), dtype=bool)
    for t in range(T):
        wanted = [t] + [i for i in range(t) if t + 1 < T and S[t + 1, i] and not on_device[t, i]]
        while wanted:
            node = wanted.pop()
            if not R[t, node]:
                R[t, node] = True
                wanted.extend(i for i in graph.predecessors[node] if not on_device[t, i])
    return R


def _joint_oracle(graph: Graph, budget: int) -> float | None:
    """The cheapest plan within `budget` by exhaustive search over S, the copies back (each where its value is read
    again, two stages or more after it is made), for each value copied back every stage of its copy out, and for each
    copy back every first stage of its buffer's run that the rules allow; R the fewest computations these allow;
    priced by `oracles.moved_cost_and_usage`. Nothing from the library's planning."""
    T = graph.size
    held = useful_entries(graph)
    back = [(t, i) for i, users in enumerate(graph.users) if users for t in range(i + 2, max(users) + 1)]
    best = None
    for held_bits, back_bits in itertools.product(
        itertools.product((False, True), repeat=len(held)), itertools.product((False, True), repeat=len(back))
    ):
        S = np.zeros((T, T), dtype=bool)
        S[tuple(np.array(held, dtype=int).T)] = held_bits
        copy_in = np.zeros((T, T), dtype=bool)
        copy_in[tuple(np.array(back, dtype=int).T)] = back_bits
        R = _fewest_computations(graph, S, copy_in)
        if (copy_in & (S | R)).any():
            continue  # (m3)
        moved = sorted({int(i) for i in np.flatnonzero(copy_in.any(axis=0))})
        stages = [[s for s in range(int(np.flatnonzero(copy_in[:, i])[0]) - 1) if R[s, i] or S[s, i]] for i in moved]
        on_device = R | S | copy_in
        for outs in itertools.product(*stages):
            copy_out = np.zeros((T, T), dtype=bool)
            copy_out[list(outs), moved] = True
            runs = []  # per copy back, the buffers it may start at: after its copy out, off the device throughout
            for t, i in zip(*np.nonzero(copy_in), strict=True):
                made = outs[moved.index(int(i))]
                starts = [a for a in range(made + 1, int(t)) if not on_device[a : int(t), i].any()]
                runs.append([(int(t), int(i), a) for a in starts])
            for chosen in itertools.product(*runs):
                buffered = np.zeros((T, T), dtype=bool)
                for t, i, a in chosen:
                    buffered[a:t, i] = True
                cost, usage, _ = moved_cost_and_usage(graph, R, S, Moves(copy_out, copy_in, buffered))
                if max(usage) <= budget and (best is None or cost < best - 1e-9):
                    best = cost
    return best


def _small_chain() -> Graph:
    """The paper's chain of 2 whose first output (4 bytes, costly to recompute) is read again by the last gradient,
    with a loss that takes 5 bytes of workspace: below the peak of holding it, moving it and recomputing it compete."""
    graph = linear_graph(2)
    sizes, costs, workspaces = (4, 1, 1, 1, 1), (3.0, 1.0, 1.0, 1.0, 1.0), (0, 0, 5, 0, 0)
    nodes = tuple(
        dataclasses.replace(node, memory=size, cost=cost, workspace=workspace)
        for node, size, cost, workspace in zip(graph.nodes, sizes, costs, workspaces, strict=True)
    )
    link = HostLink(to_host_per_byte=0.4, to_device_per_byte=0.3, latency=0.1, overlap=0.7)
    return dataclasses.replace(graph, nodes=nodes, host_link=link)


@pytest.mark.parametrize("budget", range(6, 13))
def test_the_milp_finds_the_exhaustive_optimum_with_moves(budget: int) -> None:
    """Below 7 bytes nothing fits; from 7 to 10 the optimum moves the first output (7.6, where recomputing it costs
    10); from 11 it holds it (7.0). The MILP's plan costs the exhaustive optimum at each budget, proven."""
    graph = _small_chain()
    best = _joint_oracle(graph, budget)
    if best is None:
        with pytest.raises(InfeasibleBudget):
            solve(graph, budget, method="optimal", time_limit=30, progress=False)
        return
    plan = solve(graph, budget, method="optimal", time_limit=30, progress=False)
    assert plan.cost == pytest.approx(best) and plan.status == "optimal"
    if budget <= 10:
        recomputing = solve(dataclasses.replace(graph, host_link=None), budget, method="optimal", progress=False)
        assert plan.moves.any and plan.cost < recomputing.cost - 1


def test_host_memory_bounds_what_is_moved() -> None:
    """With room on the host for no output, the plan at 8 bytes recomputes as the plan without a link does; with room
    for the first output alone (4 bytes), it moves that one."""
    graph = _small_chain()
    assert graph.host_link is not None
    none = dataclasses.replace(graph, host_link=dataclasses.replace(graph.host_link, host_memory=0))
    plan = solve(none, 8, method="optimal", time_limit=30, progress=False)
    assert not plan.moves.any and plan.cost == pytest.approx(10.0)
    first = dataclasses.replace(graph, host_link=dataclasses.replace(graph.host_link, host_memory=4))
    plan = solve(first, 8, method="optimal", time_limit=30, progress=False)
    assert plan.moves.any and plan.host_peak == 4 and plan.cost == pytest.approx(7.6)
