"""moved_closure_bound: every row holds for every valid plan with moves, it is never above the exhaustive joint
optimum, and it sits between every node once (a free link) and the closure bound (a link too dear to use)."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from bound_graphs import moved_chain
from exhaustive import joint_optimum
from oracles import moved_cost_and_usage, random_plans_with_moves

from checkmate.bounds import closure_bound, moved_closure_bound
from checkmate.bounds.moved_closure import link_columns, moved_stage_problem
from checkmate.examples import linear_graph
from checkmate.graph import Graph
from checkmate.moved import HostLink, Moves
from checkmate.solve import solve


def _columns(graph: Graph, R: np.ndarray, S: np.ndarray, moves: Moves, cost: float, stage: int, nodes: np.ndarray,
             unit: float) -> np.ndarray:  # fmt: skip
    """The MILP's columns read off a plan by their definitions (module doc of `checkmate.bounds.moved_closure`):
    h_u, u's bytes on the device while node b runs (held out of stage b, copied out in it, or a copy back's
    buffer); r_u, computed in a stage after b; a_u, neither, and copied back after b; X, the cost beyond every node
    once and the r columns' recomputations, in the X column's unit; then the link's cumulative columns, which those
    of a and r fix (`link_columns`)."""
    T = graph.size
    buffered, copied_out, copied_in = moves.buffers(T), moves.copied_out(T), moves.copied_in(T)
    held_out = S[stage + 1, nodes] if stage + 1 < T else np.zeros(nodes.size, dtype=bool)
    held = held_out.astype(bool) | buffered[stage, nodes] | copied_out[stage, nodes]
    rebuilt = R[stage + 1 :, nodes].any(axis=0)
    away = ~held & ~rebuilt & copied_in[stage + 1 :, nodes].any(axis=0)
    extra = cost - graph.least_cost - float(graph.recompute_costs[nodes] @ rebuilt)
    core = np.concatenate([held, rebuilt, away, [extra / unit]]).astype(np.float64)
    return np.concatenate([core, link_columns(graph, stage, nodes, rebuilt, away)])


@pytest.mark.parametrize("seed", range(4))
def test_every_row_holds_for_every_plan_with_moves(seed: int) -> None:
    """Plans that move one value each (copied out where it is made or after a read, copied back for each later
    read), from checkpoint_all and Chen's plan, on random graphs and links, at a budget of the plan's own peak: at
    every stage, the plan's columns meet every row, and the objective is the plan's cost beyond every node once.
    Cost and peak from the oracle (`oracles.moved_cost_and_usage`), not the simulator."""
    graph, plans = random_plans_with_moves(seed, 0.3)
    checked = away = 0
    for label, R, S, moves in plans:
        cost, usage, _ = moved_cost_and_usage(graph, R, S, moves)
        for stage in range(graph.size):
            milp = moved_stage_problem(graph, max(usage), stage)
            if milp is None:
                continue
            x = _columns(graph, R, S, moves, cost, stage, milp.nodes, float(milp.problem.c[3 * milp.nodes.size]))
            n = milp.nodes.size
            assert x[3 * n] >= -1e-9
            assert milp.problem.max_violation(x) < 1e-9, (label, stage)
            assert milp.problem.c @ x == pytest.approx(cost - graph.least_cost)
            checked += 1
            away += int(x[2 * n : 3 * n].sum())
    assert checked > 0 and away > 0


@pytest.mark.parametrize("budget", range(7, 13))
def test_never_above_the_exhaustive_joint_optimum(budget: int) -> None:
    """On the chain where moving, holding and recomputing its first output compete (`bound_graphs.moved_chain`),
    the bound is at most the cheapest plan with moves that the exhaustive search finds, at each budget; where that
    optimum moves (7-10 bytes) the bound is above every node once but below the closure bound of the same graph
    without its link (which only recomputes), and its answer moves a value."""
    graph = moved_chain()
    best = joint_optimum(graph, budget)
    assert best is not None
    found = moved_closure_bound(graph, budget, time_limit=30)
    assert graph.least_cost - 1e-9 <= found.bound <= best + 1e-9 and found.proven
    plain = closure_bound(dataclasses.replace(graph, host_link=None), budget, time_limit=30)
    assert found.bound <= plain.bound + 1e-9
    if budget <= 10:
        assert found.bound < plain.bound - 1
        assert found.away is not None and found.away.size > 0


def test_a_free_link_bounds_at_every_node_once_and_a_dear_one_at_the_closure_bound() -> None:
    """The paper's chain of 8 below its peak: with copies that cost nothing, anything may be away (every node once);
    with copies dearer than the whole step, or no host memory, nothing may (the closure bound without a link)."""
    plain = linear_graph(8)
    budget = solve(plain, None, method="checkpoint_all").peak_memory - 3
    closure = closure_bound(plain, budget, time_limit=30).bound
    assert closure > plain.least_cost
    free = dataclasses.replace(plain, host_link=HostLink(0.0, 0.0))
    assert moved_closure_bound(free, budget, time_limit=30).bound == pytest.approx(plain.least_cost)
    dear = dataclasses.replace(plain, host_link=HostLink(1e3, 1e3, latency=1e3))
    assert moved_closure_bound(dear, budget, time_limit=30).bound == pytest.approx(closure)
    no_room = dataclasses.replace(plain, host_link=HostLink(0.0, 0.0, host_memory=0))
    assert moved_closure_bound(no_room, budget, time_limit=30).bound == pytest.approx(closure)
