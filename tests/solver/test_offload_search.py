"""The joint search's parts (`checkmate.strategies.offload`, `checkmate.strategies.offload_starts`): moving values
until a plan fits, and a joint plan no costlier than recomputing alone or moving alone at the same budget."""

from __future__ import annotations

import contextlib
import dataclasses

import numpy as np
import pytest

from checkmate.bounds.moved_closure import moved_closure_bound
from checkmate.errors import InfeasibleBudget
from checkmate.examples import linear_graph, random_training_graph
from checkmate.graph import Graph
from checkmate.moved import HostLink, transfers
from checkmate.plan import Plan
from checkmate.progress import SearchControl
from checkmate.simulate import check_plan, stage_compute
from checkmate.solve import solve
from checkmate.strategies.copy_windows import hide_copy_waits
from checkmate.strategies.offload_starts import moved_starts

# a byte costs a tenth of a unit of compute each way: a node's output (1 to 16 bytes) moves in up to 1.6 units beside
# stages that compute 1 to 10 units, so some moves hide and some do not
LINK = HostLink(to_host_per_byte=0.1, to_device_per_byte=0.1, latency=0.05, overlap=0.8)


def _graph(seed: int) -> Graph:
    return dataclasses.replace(random_training_graph(8, seed=seed), host_link=LINK)


@pytest.mark.parametrize("seed", [0, 1, 3])
def test_offload_only_fits_without_recomputing(seed: int) -> None:
    graph = _graph(seed)
    kept = solve(graph, None, method="checkpoint_all")
    assert solve(graph, kept.peak_memory, method="offload_only").cost == kept.cost
    reached = 0
    for fraction in (0.9, 0.8, 0.7, 0.6):
        budget = int(fraction * kept.peak_memory)
        try:
            plan = solve(graph, budget, method="offload_only")
        except InfeasibleBudget:
            continue
        reached += 1
        assert plan.peak_memory <= budget and plan.moves.any
        assert (np.eye(graph.size, dtype=bool) == plan.R).all(), "offload_only never recomputes"
        check_plan(graph, plan.R, plan.S, plan.moves)
    assert reached > 0


@pytest.mark.parametrize("seed", [0, 1, 3])
def test_the_joint_plan_costs_no_more_than_recomputing_or_moving_alone(seed: int) -> None:
    graph = _graph(seed)
    plain = dataclasses.replace(graph, host_link=None)
    peak = solve(graph, None, method="checkpoint_all").peak_memory
    compared = 0
    for fraction in (0.9, 0.75, 0.6):
        budget = int(fraction * peak)
        others = []
        for on, method in ((plain, "optimal"), (graph, "offload_only")):
            with contextlib.suppress(InfeasibleBudget):
                others.append(solve(on, budget, method=method, **({"time_limit": 20} if method == "optimal" else {})))
        if not others:
            continue
        joint = solve(graph, budget, method="optimal", time_limit=30, progress=False)
        assert joint.peak_memory <= budget
        for other in others:
            assert joint.cost <= other.cost + 1e-9, (fraction, other.method)
        compared += 1
    assert compared > 0


def test_the_bound_rung_moves_what_the_bound_moves() -> None:
    """On a chain whose link is dear enough that the closure bound with moves still recomputes, its answer moves
    values across the binding stage; the bound's rung holds them in a recomputing plan at the budget plus their
    bytes and moves them first: the starts given the answer fit, are valid, move every one of them, and cost within
    5 % of the bound, which the starts without it (the looser budgets' rungs alone) do not reach here."""
    link = HostLink(to_host_per_byte=1.5, to_device_per_byte=1.5, latency=0.05, overlap=0.8)
    graph = dataclasses.replace(linear_graph(24), host_link=link)
    budget = int(0.5 * solve(graph, None, method="checkpoint_all").peak_memory)
    answer = moved_closure_bound(graph, budget, time_limit=30)
    assert answer.away is not None and answer.away.size > 0
    plan = moved_starts(graph, budget, SearchControl(time_limit=30), method="optimal", answer=answer)
    assert plan is not None and plan.peak_memory <= budget
    check_plan(graph, plan.R, plan.S, plan.moves)
    moved = np.flatnonzero(plan.moves.copy_out.any(axis=0))
    assert set(answer.away.tolist()) <= set(moved.tolist())
    assert answer.bound <= plan.cost <= 1.05 * answer.bound
    without = moved_starts(graph, budget, SearchControl(time_limit=30), method="optimal")
    assert without is None or without.cost > 1.05 * answer.bound


@pytest.mark.parametrize("seed", [1, 3])
def test_copies_the_step_waits_for_are_held_on_where_memory_has_room(seed: int) -> None:
    """offload_all copies each value out in the stage that makes it and drops it after its next reader: on a dear
    link the step waits for those copies. Held on in later stages with room below offload_all's own peak, the copies
    run beside their compute: the waits shrink, the plan stays valid and within that peak. Holding on without
    looking at each stage's room crosses the peak here, and the plan would be given back unchanged; a budget below
    the plan's own peak gives it back too."""
    link = HostLink(to_host_per_byte=1.0, to_device_per_byte=0.1, latency=0.05, overlap=0.8)
    graph = dataclasses.replace(random_training_graph(8, seed=seed), host_link=link)
    moved = solve(graph, None, method="offload_all")

    def waits(plan: Plan) -> float:
        return transfers(graph.memory, link, plan.moves, plan.S, stage_compute(graph, plan.R)).exposed_time

    assert waits(moved) > 0
    held_on = hide_copy_waits(graph, moved, moved.peak_memory, method="held_on")
    check_plan(graph, held_on.R, held_on.S, held_on.moves)
    assert held_on.peak_memory <= moved.peak_memory
    assert waits(held_on) < waits(moved) and held_on.cost == pytest.approx(moved.cost - (waits(moved) - waits(held_on)))
    assert (held_on.R == moved.R).all() and (held_on.S >= moved.S).all() and held_on.S.sum() > moved.S.sum()
    assert hide_copy_waits(graph, moved, moved.peak_memory - 1, method="held_on") is moved
