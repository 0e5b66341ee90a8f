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
import logging
import time

import numpy as np

from checkmate.errors import MethodNotApplicable
from checkmate.graph import Graph
from checkmate.moved import Moves, stages_covering, transfer_schedule
from checkmate.plan import Plan, make_plan, schedule_of
from checkmate.simulate import Schedule, stage_compute
from checkmate.strategies.checkpoint_all import checkpoint_all_s
from checkmate.strategies.common import cheapest_within, infeasible, plan_from_s
from checkmate.strategies.copy_windows import hide_copy_waits
from checkmate.strategies.registry import register

log = logging.getLogger(__name__)

SHORTEST_GAP = 3  # a copy back for stage t fills its buffer in stage t - 1: a gap of 2 stages frees nothing


def offloaded(graph: Graph, plan: Plan, *, method: str) -> Plan:
    """`plan` with its long holds moved to host memory (module doc); the plan itself when nothing can be."""
    if graph.host_link is None:
        raise MethodNotApplicable("moves to host memory need a graph with a host_link")
    T = graph.size
    R, S = plan.R.astype(bool), plan.S.astype(bool)
    needed = R | _reads(graph, R)
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


def offload_to_fit(
    graph: Graph,
    plan: Plan,
    budget: int,
    *,
    method: str,
    deadline: float | None = None,
    preferred: frozenset[int] = frozenset(),
) -> Plan | None:
    """`plan` with values moved to host memory until its peak fits `budget` bytes; None when no move is left that
    lowers the stage at the peak, or when `time.perf_counter()` passes `deadline`. Values `preferred` are taken
    before the others, and a copy out of theirs that the free link time before the peak does not cover runs on to
    the stage before it instead of ending after the value's last need (the closure bound's answer with moves,
    `checkmate.strategies.offload_starts`, whose copies the link carries in aggregate).

    Each round takes the peak stage p and every value held across it and needed again three stages or more after its
    last need before p (a gap (a, b) around p), each as it would be moved: copied out where it is first made (where
    it is held from there to a; else in stage a), held on past a while its copy out needs the link time the stages
    lend (`HostLink.overlap` x compute, less what the plan's copies already use there), its copy back's buffer run
    started as many stages before b as its copy needs, both clear of p (where the free time before p does not cover
    a copy out, it ends right after a, and the step waits for it there; where the free time after p does not cover a
    copy back, its buffer is stage b - 1 alone). Its price is the copy time those stages cannot lend (what it would
    add to the step, were it alone on the link beside the plan's copies). The values are taken cheapest per byte
    first (the largest first among those the free link time hides), among those the link's `host_memory` has room
    for, until stage p's bytes fit the budget. The plan is then built (its true time and peak; lowered again by
    the next round for its peak stage), and the next round starts from its peak. Other gaps of a moved value stay
    held. Last, the values whose copies out the step waits for are held on where memory has room
    (`checkmate.strategies.copy_windows`)."""
    link = graph.host_link
    if link is None:
        raise MethodNotApplicable("moves to host memory need a graph with a host link")
    T = graph.size
    current = plan
    R = plan.R.astype(bool)
    needed = R | _reads(graph, R)
    first_made = np.argmax(R, axis=0)
    compute = stage_compute(graph, R)
    lent = link.overlap * compute
    out_costs, in_costs = link.to_host_costs(graph.memory), link.to_device_costs(graph.memory)
    while current.peak_memory > budget:
        if deadline is not None and time.perf_counter() > deadline:
            return None
        schedule = schedule_of(graph, current)
        p = _peak_stage(schedule)
        moves = current.moves
        used = transfer_schedule(graph.memory, link, moves, current.S, compute)
        free_out = np.maximum(lent - used.to_host.sum(axis=1), 0.0)
        free_in = np.maximum(lent - used.to_device.sum(axis=1), 0.0)
        room = np.inf if link.host_memory is None else link.host_memory - current.host_peak
        candidates = current.S[p] & ~needed[p] & (graph.memory > 0) & ~moves.copied_out(T).any(axis=0)
        gaps: dict[int, tuple[int, int, int]] = {}  # node: (first stage of its copy out's window, a, b)
        for i in np.flatnonzero(candidates).tolist():
            stages = np.flatnonzero(needed[:, i])
            before, after = stages[stages < p], stages[stages > p]
            if before.size and after.size:
                a, b = int(before[-1]), int(after[0])
                if current.S[a + 1 : b + 1, i].all() and not R[a + 1 : b + 1, i].any():
                    made = int(first_made[i])
                    gaps[i] = (made if current.S[made + 1 : a + 1, i].all() else a, a, b)
        S, out, back, buffer = current.S.copy(), moves.copied_out(T), moves.copied_in(T), moves.buffers(T)
        excess, taken = schedule.peak_memory - budget, 0
        while excess > 0:
            priced = [
                move
                for i, (start, a, b) in gaps.items()
                if int(graph.memory[i]) <= room
                and (
                    move := _priced_move(
                        i,
                        int(graph.memory[i]),
                        start,
                        a,
                        b,
                        p,
                        out_costs[i],
                        in_costs[i],
                        free_out,
                        free_in,
                        hold_on=i in preferred,
                    )
                )
                is not None
            ]
            if not priced:
                break
            _, _, i, start, held_until, first_buffer, b = min(priced, key=lambda move: (move[2] not in preferred, move))
            del gaps[i]
            S[held_until + 1 : b + 1, i] = False
            out[start, i] = True
            back[b, i] = True
            buffer[first_buffer:b, i] = True
            _lend(free_out, range(start, held_until + 1), out_costs[i])
            _lend(free_in, range(b - 1, first_buffer - 1, -1), in_costs[i])
            excess -= int(graph.memory[i])
            room -= int(graph.memory[i])
            taken += 1
        log.debug("offload_to_fit: stage %d at the peak, %d values moved, %d bytes over", p, taken, excess)
        if not taken:
            return None
        trial = make_plan(graph, current.R, S, moves=Moves(out, back, buffer), method=method)
        if trial.peak_memory > current.peak_memory:
            return None  # a move holds its value's bytes only within its old hold: not expected
        current = trial  # each round moves a value more: the rounds end
    return hide_copy_waits(graph, current, budget, method=method, deadline=deadline)


def _priced_move(
    i: int,
    size: int,
    start: int,
    a: int,
    b: int,
    p: int,
    out_cost: float,
    in_cost: float,
    free_out: np.ndarray,
    free_in: np.ndarray,
    *,
    hold_on: bool = False,
) -> tuple[float, int, int, int, int, int, int] | None:
    """Node i's gap (a, b) around the peak stage p moved (`offload_to_fit`), its copy out started in stage `start`
    (it is held from there to a): (its price per byte, minus its `size` bytes, i, start, the last stage it stays
    held, the first stage of its copy back's buffer, b), or None when its copy back's buffer cannot clear p. The
    price is the copy time that the link's free time in those stages (`free_out`, `free_in`) does not cover; the
    smallest first, then the largest value (fewer copies for the same bytes)."""
    held_until = max(a, stages_covering(free_out, start, out_cost, forward=True))
    if held_until > p - 1:
        # the free link time before p does not cover it: the step waits for it after its last need, or (`hold_on`)
        # the copy runs on to the stage before p, beside the other copies' (where the link can carry them all)
        held_until = p - 1 if hold_on else a
    first_buffer = min(b - 1, stages_covering(free_in, b - 1, in_cost, forward=False))
    if first_buffer < p + 1:
        first_buffer = b - 1  # nor after p: the step waits for it before its next need
    if first_buffer < p + 1:
        return None
    unlent = max(0.0, out_cost - float(free_out[start : held_until + 1].sum()))
    unlent += max(0.0, in_cost - float(free_in[first_buffer:b].sum()))
    return unlent / size, -size, i, start, held_until, first_buffer, b


def _lend(free: np.ndarray, stages: range, work: float) -> None:
    """Take `work` of the link's free time from `stages`, in their order, as far as it goes."""
    for stage in stages:
        used = min(work, float(free[stage]))
        free[stage] -= used
        work -= used
        if work <= 0:
            return


def _reads(graph: Graph, R: np.ndarray) -> np.ndarray:
    """bool[T, T]: read[t, i] where a consumer of node i is computed in stage t."""
    T = graph.size
    read = np.zeros((T, T), dtype=bool)
    for j, sources in enumerate(graph.predecessors):
        if sources:
            read[np.ix_(R[:, j], np.array(sources, dtype=np.int64))] = True
    return read


def _peak_stage(schedule: Schedule) -> int:
    """The stage of the schedule's peak moment (the first, where several stages reach it)."""
    return int(np.argmax(schedule.stage_peaks()))


@register(
    "offload_only",
    "no recomputation: checkpoint_all with values moved to host memory, the cheapest per byte first, until the peak "
    "fits the budget (a graph with a host link)",
    needs_host_link=True,
)
def offload_only(graph: Graph, budget: int | None) -> Plan:
    kept = plan_from_s(graph, checkpoint_all_s(graph), method="offload_only")
    if budget is None or kept.peak_memory <= budget:
        return kept
    moved = offload_to_fit(graph, kept, budget, method="offload_only")
    if moved is None:
        raise infeasible("offload_only", budget, None, hint="no more values can be moved to lower its peak")
    return moved
