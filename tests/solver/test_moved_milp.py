"""Moves to host memory in the MILP (`checkmate.milp.moves`): every valid plan with moves is a feasible point with
its simulated cost, and the search moves values where the link is cheap and recomputes where it is dear."""

from __future__ import annotations

import dataclasses

import pytest
from bound_graphs import moved_chain
from exhaustive import joint_optimum
from oracles import moved_cost_and_usage, random_plans_with_moves

from checkmate.errors import InfeasibleBudget
from checkmate.examples import linear_graph
from checkmate.graph import Graph
from checkmate.milp.formulation import decode_plan_moves, encode, encode_solution
from checkmate.milp.scaling import memory_scale
from checkmate.moved import HostLink
from checkmate.simulate import lower
from checkmate.solve import solve

FAST = HostLink(to_host_per_byte=0.1, to_device_per_byte=0.1, latency=0.0, overlap=1.0)
SLOW = HostLink(to_host_per_byte=5.0, to_device_per_byte=5.0, latency=1.0, overlap=0.2)


@pytest.mark.parametrize("seed", range(4))
def test_valid_plans_with_moves_are_feasible_points_with_the_simulated_cost(seed: int) -> None:
    graph, plans = random_plans_with_moves(seed, 0.2)
    scale = memory_scale(graph)
    checked = 0
    for label, R, S, moves in plans:
        schedule = lower(graph, R, S, moves=moves)
        budget = scale.budget_units(schedule.peak_memory, graph.fixed_memory)
        problem, index = encode(graph, budget, scale)
        x = encode_solution(graph, index, R, S, moves=moves)
        assert problem.max_violation(x) < 1e-9, label
        assert problem.c @ x == pytest.approx(schedule.cost)
        assert problem.c @ x == pytest.approx(moved_cost_and_usage(graph, R, S, moves)[0])
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


@pytest.mark.parametrize("budget", range(6, 13))
def test_the_milp_finds_the_exhaustive_optimum_with_moves(budget: int) -> None:
    """Below 7 bytes nothing fits; from 7 to 10 the optimum moves the first output (7.6, where recomputing it costs
    10); from 11 it holds it (7.0). The MILP's plan costs the exhaustive optimum at each budget, proven."""
    graph = moved_chain()
    best = joint_optimum(graph, budget)
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
    graph = moved_chain()
    assert graph.host_link is not None
    none = dataclasses.replace(graph, host_link=dataclasses.replace(graph.host_link, host_memory=0))
    plan = solve(none, 8, method="optimal", time_limit=30, progress=False)
    assert not plan.moves.any and plan.cost == pytest.approx(10.0)
    first = dataclasses.replace(graph, host_link=dataclasses.replace(graph.host_link, host_memory=4))
    plan = solve(first, 8, method="optimal", time_limit=30, progress=False)
    assert plan.moves.any and plan.host_peak == 4 and plan.cost == pytest.approx(7.6)
