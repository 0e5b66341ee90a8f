"""Local search on the full graph: spend memory the plan leaves unused on holding values it recomputes.

A plan made on a coarse graph (or by a heuristic) often peaks well below the budget. Each move takes a node i
that the plan recomputes and holds it over a span of stages instead: from its first computation, or from one of
its recomputations, through a later recomputation. R is then the cheapest for the new checkpoints (the
recomputations the held copy serves disappear, with those of ancestors that only fed them), unused checkpoints
are dropped, and the simulator decides: a move is kept when the plan gets cheaper and still fits the budget.
Moves are tried in order of recomputation cost saved per byte held per stage, best first, until none helps or the
time is up; a move whose value would not fit beside the peak of a stage it is held through is not tried.
"""

from __future__ import annotations

import logging

import numpy as np

from checkmate.graph import Graph
from checkmate.plan import Plan, cheapest_r, make_plan, prune_checkpoints
from checkmate.progress import SearchControl
from checkmate.simulate import Compute, lower

log = logging.getLogger(__name__)

# Moves evaluated per round before the candidates are ranked again from the new plan.
MOVES_PER_ROUND = 64
# swap_holds: nodes whose holds are dropped at once, and fruitless attempts in a row before it gives up.
SWAP_SIZE = 2
SWAP_ATTEMPTS = 200


def hold_more(
    graph: Graph,
    plan: Plan,
    budget: int,
    control: SearchControl,
    *,
    method: str,
    excluded: frozenset[int] = frozenset(),
) -> Plan:
    """Improve `plan` by holding recomputed values where the budget allows (see the module doc); nodes in
    `excluded` are left as they are."""
    best = plan
    evaluated = 0
    while not control.stopped:
        improved = False
        room = budget - stage_peaks(graph, best)
        tried = 0
        for node, first, last in _moves(graph, best):
            if control.stopped or tried >= MOVES_PER_ROUND:
                break
            if node in excluded:
                continue
            if first + 1 < last and room[first + 1 : last].min() < graph.memory[node]:
                continue  # held through those stages, it would not fit beside their peaks
            tried += 1
            S = best.S.copy()
            S[first + 1 : last + 1, node] = True
            R, S = prune_checkpoints(graph, cheapest_r(graph, S), S)
            candidate = make_plan(graph, R, S, method=method)
            evaluated += 1
            if candidate.peak_memory <= budget and candidate.cost < best.cost - 1e-9:
                best, improved = candidate, True
                control.report("hold more", cost=best.cost)
                break
        if not improved:
            break
    log.debug("hold more: %d moves evaluated, cost %.6g -> %.6g", evaluated, plan.cost, best.cost)
    return best


def swap_holds(graph: Graph, plan: Plan, budget: int, control: SearchControl, *, method: str, seed: int = 0) -> Plan:
    """Iterated local search: drop every hold of a few held nodes (drawn with weight bytes x stages held), let
    `hold_more` spend the freed memory on other nodes, and keep the result when it is cheaper; until time is up or
    `SWAP_ATTEMPTS` drops in a row gave nothing."""
    rng = np.random.default_rng(seed)
    best = plan
    failures = 0
    while not control.stopped and failures < SWAP_ATTEMPTS:
        held = best.S.sum(axis=0) * graph.memory
        candidates = np.flatnonzero(held > 0)
        if candidates.size == 0:
            break
        dropped = rng.choice(
            candidates, size=min(SWAP_SIZE, candidates.size), replace=False, p=_weights(held, candidates)
        )
        S = best.S.copy()
        S[:, dropped] = False
        R, S = prune_checkpoints(graph, cheapest_r(graph, S), S)
        start = make_plan(graph, R, S, method=method)
        candidate = hold_more(graph, start, budget, control, method=method, excluded=frozenset(int(n) for n in dropped))
        if candidate.peak_memory <= budget and candidate.cost < best.cost - 1e-9:
            best, failures = candidate, 0
            control.report("swap holds", cost=best.cost)
        else:
            failures += 1
    log.info("swap holds: cost %.6g -> %.6g", plan.cost, best.cost)
    return best


def _weights(held: np.ndarray, candidates: np.ndarray) -> np.ndarray:
    weights = held[candidates].astype(np.float64)
    return weights / weights.sum()


def stage_peaks(graph: Graph, plan: Plan) -> np.ndarray:
    """int64[T]: the highest usage of each stage (the simulator's, fixed memory and workspaces included)."""
    schedule = lower(graph, plan.R, plan.S)
    stages = [step.stage for step in schedule.steps if isinstance(step, Compute)]
    peaks = np.zeros(graph.size, dtype=np.int64)
    np.maximum.at(peaks, stages, schedule.usage)
    return peaks


def _moves(graph: Graph, plan: Plan) -> list[tuple[int, int, int]]:
    """(node, from stage, through stage) spans that would remove recomputations, most saving per byte first."""
    R = plan.R
    recomputed = R & ~np.eye(graph.size, dtype=bool)
    moves: list[tuple[float, int, int, int]] = []
    for node in np.flatnonzero(recomputed.any(axis=0)):
        stages = np.flatnonzero(R[:, node])
        size = max(int(graph.memory[node]), 1)
        cost = float(graph.costs[node])
        for position in range(1, len(stages)):
            for start in (stages[0], stages[position - 1]) if position > 1 else (stages[0],):
                saved = cost * (position if start == stages[0] else 1)
                span = int(stages[position] - start)
                moves.append((saved / (size * span), int(node), int(start), int(stages[position])))
    moves.sort(key=lambda move: -move[0])
    return [(node, first, last) for _, node, first, last in moves]
