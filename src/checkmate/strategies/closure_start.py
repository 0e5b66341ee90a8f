"""A starting plan from the closure bound's answer: hold what it holds across the binding stage, rebuild the rest once.

The closure bound (`checkmate.bounds.closure`) solves, at the stage b where memory binds, which values to hold out
of stage b (`held`) and which to rebuild after it (`rebuilt`, with every input they are rebuilt from). Its answer
becomes checkpoints S:

* a node that is not an ancestor of what crosses b, or that comes at or after b, is held from its stage to its last
  use, as checkpoint_all holds it;
* every other node is held from its stage through its last use at or before b; then
  * a held node stays held until its last use after b, or the last rebuild that reads it;
  * a rebuilt node is computed again at the first stage after b that needs it (its own first user after b, or the
    rebuild of a user that needs it first) and held until the last such stage.

The cheapest R for those S (`checkmate.plan.cheapest_r`) computes what is missing. Where memory binds at b only,
as at a transformer's language-model or classifier head, the plan costs what the bound proves and fits: on GPT-2
small it is proven optimal at once, cheaper than what the large-graph search finds without it.

Where the rebuilds pile up after b and the plan peaks above the budget at another stage t, a row for t joins the
stage's MILP and it is solved again (at most `REPAIR_ROUNDS` times): the bytes of the nodes of the MILP that would
be live at t if held or if rebuilt, as the current answer times its rebuilds, plus what else the plan holds at t,
within the budget. These rows estimate; they are not part of the bound, and the simulator has the last word.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, replace

import numpy as np
import scipy.sparse as sp

from checkmate.bounds.closure import ClosureBound, solve_stage, stage_answer, stage_problem
from checkmate.bounds.gaps import last_use
from checkmate.graph import Graph
from checkmate.plan import Plan, cheapest_r, make_plan, prune_checkpoints, schedule_of
from checkmate.simulate import Compute

log = logging.getLogger(__name__)

REPAIR_ROUNDS = 8


@dataclass(frozen=True)
class _Answer:
    """Which nodes the plan holds out of `stage` and which it rebuilds after it."""

    stage: int
    held: np.ndarray
    rebuilt: np.ndarray


def closure_start(
    graph: Graph,
    budget: int,
    found: ClosureBound,
    *,
    method: str,
    time_limit: float | None = None,
    should_stop: Callable[[], bool] | None = None,
    interrupted: Callable[[], bool] | None = None,
) -> Plan | None:
    """The plan of the module doc from `found`'s answer, repaired while it peaks above `budget` and time is left
    (it may still exceed the budget: the caller checks); None when `found` has no answer."""
    if found.stage is None or found.held is None or found.rebuilt is None:
        return None
    started = time.perf_counter()
    answer = _Answer(found.stage, found.held, found.rebuilt)
    plan = _plan(graph, answer, method)
    milp = stage_problem(graph, budget, answer.stage)
    if milp is None:
        return plan
    rows: list[tuple[np.ndarray, float]] = []
    for _ in range(REPAIR_ROUNDS):
        left = None if time_limit is None else time_limit - (time.perf_counter() - started)
        if plan.peak_memory <= budget or (left is not None and left <= 0) or (should_stop and should_stop()):
            break
        rows.append(_row(graph, plan, answer, milp.nodes, budget))
        coefficients = np.stack([row for row, _ in rows])
        problem = replace(
            milp.problem,
            A=sp.vstack([milp.problem.A, sp.csc_array(-coefficients)], format="csc"),
            row_lower=np.concatenate([milp.problem.row_lower, [-rhs for _, rhs in rows]]),
            row_upper=np.full(milp.problem.row_lower.size + len(rows), np.inf),
        )
        _, _, x = solve_stage(problem, left, should_stop, interrupted)
        if x is None:
            break
        held, rebuilt, _ = stage_answer(milp.nodes, x)
        answer = _Answer(answer.stage, held, rebuilt)
        plan = _plan(graph, answer, method)
    log.info("closure start: cost %.6g, peak %d for a budget of %d", plan.cost, plan.peak_memory, budget)
    return plan


def _plan(graph: Graph, answer: _Answer, method: str) -> Plan:
    last = last_use(graph)
    S = np.zeros((graph.size, graph.size), dtype=bool)
    for node in range(graph.size):
        S[node + 1 : last[node] + 1, node] = True
    first, final = _needs_after(graph, answer.stage, set(answer.rebuilt.tolist()))
    held = set(answer.held.tolist())
    for node in (int(v) for v in np.concatenate([answer.held, answer.rebuilt])):
        before = _last_use_until(graph, node, answer.stage)
        S[before + 1 :, node] = False
        if node in held and node in final:
            S[before + 1 : final[node] + 1, node] = True
        elif node in first:
            S[first[node] + 1 : final[node] + 1, node] = True
    R, S = prune_checkpoints(graph, cheapest_r(graph, S), S)
    return make_plan(graph, R, S, method=method)


def _last_use_until(graph: Graph, node: int, stage: int) -> int:
    return max((user for user in graph.users[node] if user <= stage), default=node)


def _needs_after(graph: Graph, stage: int, rebuilt: set[int]) -> tuple[dict[int, int], dict[int, int]]:
    """For each node before `stage` needed after it: the first and the last stage after `stage` that need it (a
    user, or the first stage of a rebuilt user). Nodes are visited last to first, so a user's first stage is known."""
    first: dict[int, int] = {}
    final: dict[int, int] = {}
    for node in range(stage - 1, -1, -1):
        needs = [user for user in graph.users[node] if user > stage]
        needs += [first[user] for user in graph.users[node] if user in rebuilt and user in first]
        if needs:
            first[node], final[node] = min(needs), max(needs)
    return first, final


def _row(graph: Graph, plan: Plan, answer: _Answer, nodes: np.ndarray, budget: int) -> tuple[np.ndarray, float]:
    """The estimated row for the stage t where `plan` peaks: coefficients over the MILP's columns (h, then r) and
    the bytes they may take, `budget` less what else the plan holds at t (module doc)."""
    schedule = schedule_of(graph, plan)
    peaks = np.zeros(graph.size, dtype=np.int64)
    for step, usage in zip((step for step in schedule.steps if isinstance(step, Compute)), schedule.usage, strict=True):
        peaks[step.stage] = max(peaks[step.stage], usage)
    t = int(np.argmax(peaks))
    live = plan.S[t + 1] | plan.R[t] if t + 1 < graph.size else plan.R[t].copy()
    sizes = graph.memory[nodes].astype(np.float64)
    other = float(peaks[t]) - float(sizes[live[nodes]].sum())
    current_first, current_final = _needs_after(graph, answer.stage, set(answer.rebuilt.tolist()))
    every_first, every_final = _needs_after(graph, answer.stage, set(nodes.tolist()))
    if_held = np.zeros(nodes.size)
    if_rebuilt = np.zeros(nodes.size)
    for k, node in enumerate(int(v) for v in nodes):
        before = _last_use_until(graph, node, answer.stage)
        first = current_first.get(node, every_first.get(node))
        final = current_final.get(node, every_final.get(node))
        in_forward = node < t <= before
        if_held[k] = in_forward or (final is not None and node < t <= final)
        if_rebuilt[k] = in_forward or (first is not None and final is not None and first <= t <= final)
    unit = float(max(sizes.max(initial=0.0), 1.0))  # rows in units of the largest column's bytes, as the MILP's
    return np.concatenate([if_held * sizes, if_rebuilt * sizes]) / unit, (budget - other) / unit
