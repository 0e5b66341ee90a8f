"""Moves in place of long holds: a plan's values copied to host memory across the stages where nobody reads them.

`offloaded(graph, plan)` keeps the plan's computations (R) and, for each node's output, finds the gaps between the
stages where it is on the device for a reason (made, or read there): where a gap is held by S over three stages or
more (read at p, next at t >= p + 3), the output is copied out in the stage it is first made and copied back for
stage t instead, which frees its bytes in stages p + 1 to t - 2 (stage t - 1 holds its copy's buffer,
`checkmate.moved`). A recomputed value's copy comes from its first computation: every computation of a node makes
the same value. When the link has a `host_memory`, outputs are moved by the bytes they free x stages, most first,
while they fit.

`offload_all` is that transformation of checkpoint_all: no recomputation, every long hold moved. It is a baseline,
and a start of the searches on a graph with a host link, as the MILP's moves are weighed against it.
"""

from __future__ import annotations

import itertools

import numpy as np

from checkmate.errors import MethodNotApplicable
from checkmate.graph import Graph
from checkmate.moved import Moves
from checkmate.plan import Plan, make_plan
from checkmate.strategies.checkpoint_all import checkpoint_all_s
from checkmate.strategies.common import cheapest_within, plan_from_s
from checkmate.strategies.registry import register

SHORTEST_GAP = 3  # a copy back for stage t fills its buffer in stage t - 1: a gap of 2 stages frees nothing


def offloaded(graph: Graph, plan: Plan, *, method: str) -> Plan:
    """`plan` with its long holds moved to host memory (module doc); the plan itself when nothing can be."""
    if graph.host_link is None:
        raise MethodNotApplicable("moves to host memory need a graph with a host_link")
    T = graph.size
    R, S = plan.R.astype(bool), plan.S.astype(bool)
    read = np.zeros((T, T), dtype=bool)  # read[t, i]: a consumer of node i is computed in stage t
    for j, sources in enumerate(graph.predecessors):
        if sources:
            read[np.ix_(R[:, j], np.array(sources, dtype=np.int64))] = True
    needed = R | read
    candidates: list[tuple[int, int, list[tuple[int, int]]]] = []  # (freed bytes x stages, node, gaps)
    for i in np.flatnonzero(graph.memory > 0).tolist():
        stages = np.flatnonzero(needed[:, i])
        gaps = [
            (int(p), int(t))
            for p, t in itertools.pairwise(stages.tolist())
            if t - p >= SHORTEST_GAP and S[p + 1 : t + 1, i].all() and not R[t, i]
        ]
        if gaps:
            freed = sum(t - p - 2 for p, t in gaps) * int(graph.memory[i])
            candidates.append((freed, int(i), gaps))
    if not candidates:
        return plan
    host_memory = graph.host_link.host_memory
    S, copy_out, copy_in = S.copy(), np.zeros((T, T), dtype=bool), np.zeros((T, T), dtype=bool)
    held_on_host = 0
    for _, i, gaps in sorted(candidates, reverse=True):
        if host_memory is not None and held_on_host + int(graph.memory[i]) > host_memory:
            continue
        held_on_host += int(graph.memory[i])
        copy_out[int(np.flatnonzero(R[:, i])[0]), i] = True
        for p, t in gaps:
            S[p + 1 : t + 1, i] = False
            copy_in[t, i] = True
    if not copy_out.any():
        return plan
    return make_plan(graph, R, S, presence=plan.presence, moves=Moves(copy_out, copy_in), method=method)


@register(
    "offload_all",
    "no recomputation, and every output that waits three stages or more for its next reader copied to host memory "
    "and back for it (a graph with a host link)",
    needs_host_link=True,
)
def offload_all(graph: Graph, budget: int | None) -> Plan:
    kept = plan_from_s(graph, checkpoint_all_s(graph), method="offload_all")
    return cheapest_within([offloaded(graph, kept, method="offload_all")], budget, method="offload_all")
