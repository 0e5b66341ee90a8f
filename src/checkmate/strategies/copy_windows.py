"""Copies out given the link time they need: a moved value held on past its copy's window where memory has room.

A copy out's window (`checkmate.moved`) is the stages from its start while the value stays held into the next one.
Where a window ends before the link has carried the copy, the step waits there. Holding the value into one stage
more lengthens the window by a stage: its copy runs on beside that stage's compute, and the wait shrinks by the
link time that stage has free. It costs the value's bytes in the stage it is now held into, so it is done only
where that stage's peak stays within the budget.

`hide_copy_waits` does this for the copies due at each stage where the step waits: each is held on for as many
stages as the wait there needs of free link time (or as memory allows), the link's schedule is made again, and so on
until no wait can shrink. The plan is built again at the end and kept only where it is cheaper.
"""

from __future__ import annotations

import logging
import time

import numpy as np

from checkmate.graph import Graph
from checkmate.moved import copy_out_windows, stages_covering, transfer_schedule
from checkmate.plan import Plan, make_plan, schedule_of
from checkmate.simulate import stage_compute

log = logging.getLogger(__name__)

WAIT_TOLERANCE = 1e-9  # of the step's compute: a wait smaller than this is rounding


def hide_copy_waits(graph: Graph, plan: Plan, budget: int, *, method: str, deadline: float | None = None) -> Plan:
    """`plan` with the values whose copies out the step waits for held on where memory has room (module doc); `plan`
    itself where none can be or where that is not cheaper. Stops lengthening windows once `time.perf_counter()`
    passes `deadline`."""
    link = graph.host_link
    if link is None or not plan.moves.any:
        return plan
    T = graph.size
    R = plan.R.astype(bool)
    S = plan.S.copy()
    moves = plan.moves
    compute = stage_compute(graph, R)
    lent = link.overlap * compute
    occupied = R | moves.copied_in(T) | moves.buffers(T)  # stages where a value is on the device but not held
    room = budget - schedule_of(graph, plan).stage_peaks()
    tolerance = WAIT_TOLERANCE * float(compute.sum())
    copied = np.flatnonzero(moves.copied_out(T).any(axis=0))
    lengthened = 0
    while deadline is None or time.perf_counter() <= deadline:
        schedule = transfer_schedule(graph.memory, link, moves, S, compute)
        free = np.maximum(lent - schedule.to_host.sum(axis=1), 0.0)
        window = copy_out_windows(S, moves)[:, copied]
        ends = T - 1 - np.argmax(window[::-1], axis=0)
        progressed = False
        for stage in np.flatnonzero(schedule.exposed > tolerance).tolist():
            due = copied[ends == stage]
            until = stages_covering(free, stage + 1, float(schedule.exposed[stage]))
            for node in due.tolist():
                held = _hold_on(S, room, occupied, graph.memory, node, stage + 1, until + 1)
                lengthened += held
                progressed |= held > 0
        if not progressed:
            break
    if not lengthened:
        return plan
    trial = make_plan(graph, plan.R, S, presence=plan.presence, moves=moves, method=method)
    log.debug("hide_copy_waits: %d stages held on, cost %.6g -> %.6g", lengthened, plan.cost, trial.cost)
    return trial if trial.cost < plan.cost and trial.peak_memory <= budget else plan


def _hold_on(
    S: np.ndarray, room: np.ndarray, occupied: np.ndarray, memory: np.ndarray, node: int, first: int, last: int
) -> int:
    """Hold `node` into stages `first` (where it may be held already: its window then ends the stage before) to
    `last` (S), stopping at the first where the stage's `room` lacks its bytes or where it is on the device otherwise
    (`occupied`, or the stage after it: its copy back's buffer must find it gone); `room` is updated. The number of
    stages newly held."""
    size = int(memory[node])
    held = 0
    for stage in range(first, min(last, S.shape[0] - 2) + 1):
        if S[stage, node] and stage == first:
            continue
        if S[stage, node] or occupied[stage, node] or occupied[stage + 1, node] or room[stage] < size:
            break
        S[stage, node] = True
        room[stage] -= size
        held += 1
    return held
