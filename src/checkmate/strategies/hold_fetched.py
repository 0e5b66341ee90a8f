"""Keep fetched values present across the gaps between their uses where the budget has room: fewer fetches.

A plan's presence (`checkmate.fetched`) is its strategy's: the MILP decides it, every other strategy takes FSDP2's
rule, which fetches a unit again for its backward. `hold_fetched` then fills a gap between two runs of stages where a
value is present (so the value is held instead of fetched again) when the plan's peak stays within the budget and
its cost goes down, the shortest gaps first, passing again while a pass fills one. It never recomputes, so it only
uses memory the plan left unused; `checkmate.solve` applies it to every method's plan made within a budget.
"""

from __future__ import annotations

import itertools
import logging

import numpy as np

from checkmate.errors import InvalidSchedule
from checkmate.graph import Graph
from checkmate.plan import Plan, make_plan, proven_status
from checkmate.simulate import lower

log = logging.getLogger(__name__)


def gaps(presence: np.ndarray) -> list[tuple[int, int, int]]:
    """(value, first stage, last stage) of every gap between two runs of stages where a value is present."""
    found = []
    for value in range(presence.shape[1]):
        stages = np.flatnonzero(presence[:, value])
        for before, after in itertools.pairwise(stages):
            if after > before + 1:
                found.append((value, int(before) + 1, int(after) - 1))
    return found


def hold_fetched(graph: Graph, plan: Plan, budget: int) -> Plan:
    """`plan` with the gaps of its presence filled where the peak stays within `budget` bytes and the cost falls
    (module doc)."""
    presence, cost = plan.presence.copy(), plan.cost
    filled = False
    waiting = sorted(gaps(presence), key=lambda gap: (gap[2] - gap[1], gap))
    while waiting:
        refused = []
        for value, first, last in waiting:
            trial = presence.copy()
            trial[first : last + 1, value] = True
            try:
                schedule = lower(graph, plan.R, plan.S, trial, plan.moves)
            except InvalidSchedule:  # a value released before the backward: the gap must stay
                continue
            if schedule.peak_memory <= budget and schedule.cost < cost:
                presence, cost, filled = trial, schedule.cost, True
            else:
                refused.append((value, first, last))
        if len(refused) == len(waiting):
            break
        waiting = refused
    if not filled:
        return plan
    log.debug("fetched values held across gaps: %d fetches fewer", len(gaps(plan.presence)) - len(gaps(presence)))
    return make_plan(
        graph,
        plan.R,
        plan.S,
        method=plan.method,
        solve_time=plan.solve_time,
        budget=plan.budget,
        status=proven_status(cost, plan.lower_bound),
        lower_bound=plan.lower_bound,
        presence=presence,
        moves=plan.moves,
    )
