"""Starting plans that recompute less and move values to host memory to fit: the joint search's first incumbents on a
graph with a host link.

A plan that recomputes only within a looser budget (`RUNGS` x the budget, up to the peak without recomputation)
recomputes less. The first rung is the budget itself: the recomputing optimum (`optimal` without the link), so that
the joint search starts no worse than it; the looser rungs take the closure bound's answer
(`checkmate.strategies.closure_start`, optimal where one stage binds, in seconds on op-level transformers).
`offload_to_fit` then moves each rung's values to host memory, cheapest per byte first, until it fits the budget.
Where the link's copies hide behind compute, the result costs what the looser plan costs: less than the best
recomputing plan within the budget.

One more rung comes from the closure bound with moves (`checkmate.bounds.moved_closure`), when its answer moves
values: at its binding stage it holds some values, rebuilds some and moves the rest (`away`) within what the link
can carry. The recomputing plan that holds the held and the away values (`closure_start`, at the budget plus the
away values' bytes) is moved to fit with the away values taken first. The cheapest moved plan that fits is the start.
"""

from __future__ import annotations

import dataclasses
import logging
import time

import numpy as np

from checkmate.bounds.closure import ClosureBound, closure_bound
from checkmate.errors import InfeasibleBudget
from checkmate.graph import Graph
from checkmate.plan import Plan, cheapest_fitting, make_plan
from checkmate.progress import SearchControl
from checkmate.strategies.checkpoint_all import checkpoint_all
from checkmate.strategies.closure_start import closure_start
from checkmate.strategies.offload import offload_to_fit
from checkmate.strategies.registry import call_strategy

log = logging.getLogger(__name__)

RUNGS = (1.0, 1.02, 1.05, 1.1, 1.2)
# The first rung, the recomputing optimum within the budget itself, takes this share of the starts' time: it is the
# plan the search would return without the link, and the joint plan must not cost more than it. Near the recomputing
# floor that search needs most of its time; where it is proven at once, the other rungs get the rest.
FIRST_RUNG_SHARE = 0.9
CLOSURE_SHARE = 0.5  # of a looser rung's time, what its closure bound may take (the rest: its answer's plan)
BOUND_RUNG_SHARE = 0.2  # of the starts' time, what the closure bound's rung may take (seconds on op-level graphs)


def moved_starts(
    graph: Graph, budget: int, control: SearchControl, *, method: str, answer: ClosureBound | None = None
) -> Plan | None:
    """The cheapest plan within `budget` among the rungs' plans moved to fit (module doc), in the time `control`
    gives, the rung of the closure bound with moves `answer` first; None when none fits or the graph has no host
    link."""
    if graph.host_link is None:
        return None
    plain = dataclasses.replace(graph, host_link=None)
    peak = checkpoint_all(plain, None).peak_memory
    found: list[Plan] = []
    if answer is not None and answer.away is not None and answer.away.size:
        phase = control.child(control.share(BOUND_RUNG_SHARE), reports=False)
        moved = _bound_rung(graph, plain, budget, answer, phase, method=method)
        if moved is not None:
            found.append(moved)
    rungs = sorted({min(int(budget * rung), peak) for rung in RUNGS})
    for number, looser in enumerate(rungs):
        if control.stopped:
            break
        share = FIRST_RUNG_SHARE if number == 0 else 1.0 / (len(rungs) - number)
        phase = control.child(control.share(share), reports=False)
        kept = _recomputing(plain, looser, phase, exact=number == 0)
        if kept is None:
            continue
        started = make_plan(graph, kept.R, kept.S, presence=kept.presence, method=method)
        remaining = phase.remaining()
        deadline = None if remaining is None else time.perf_counter() + remaining
        moved = offload_to_fit(graph, started, budget, method=method, deadline=deadline)
        if moved is not None:
            log.debug("rung %d bytes: recomputing plan %.6g, moved to fit %.6g", looser, kept.cost, moved.cost)
            found.append(moved)
    return cheapest_fitting(found, budget)


def _recomputing(plain: Graph, budget: int, control: SearchControl, *, exact: bool) -> Plan | None:
    """A plan that only recomputes within `budget`: `optimal`'s (`exact`), or the closure bound's answer
    (`checkmate.strategies.closure_start`, optimal where one stage binds, in seconds on op-level transformers where
    `optimal` spends its first half minute on baselines); None when none is found."""
    try:
        if exact:
            return call_strategy("optimal", plain, budget, {"control": control})
        closure = closure_bound(
            plain, budget, time_limit=control.share(CLOSURE_SHARE), should_stop=lambda: control.stopped
        )
    except InfeasibleBudget:
        return None
    plan = closure_start(plain, budget, closure, method="optimal", time_limit=control.remaining())
    return plan if plan is not None and plan.peak_memory <= budget else None


def _bound_rung(
    graph: Graph, plain: Graph, budget: int, answer: ClosureBound, control: SearchControl, *, method: str
) -> Plan | None:
    """The plan of the closure bound's rung (module doc), or None where it does not fit."""
    assert answer.held is not None and answer.away is not None
    looser = budget + int(plain.memory[answer.away].sum())
    holding = dataclasses.replace(answer, held=np.union1d(answer.held, answer.away), away=None)
    kept = closure_start(plain, looser, holding, method="optimal", time_limit=control.share(CLOSURE_SHARE))
    if kept is None or kept.peak_memory > looser:
        return None
    started = make_plan(graph, kept.R, kept.S, presence=kept.presence, method=method)
    remaining = control.remaining()
    deadline = None if remaining is None else time.perf_counter() + remaining
    preferred = frozenset(answer.away.tolist())
    moved = offload_to_fit(graph, started, budget, method=method, deadline=deadline, preferred=preferred)
    if moved is not None:
        log.debug("the bound's rung, %d bytes: recomputing plan %.6g, moved to fit %.6g", looser, kept.cost, moved.cost)
    return moved
