"""Local search on the full graph: spend memory the plan leaves unused on holding values it recomputes.

A plan made on a coarse graph (or by a heuristic) often peaks well below the budget. Each move takes a node i
that the plan recomputes and holds it over a span of stages instead: from its first computation, or from one of
its recomputations, through a later recomputation. R is then the cheapest for the new checkpoints (the
recomputations the held copy serves disappear, with those of ancestors that only fed them), unused checkpoints
are dropped, and the simulator decides: a move is kept when the plan gets cheaper and still fits the budget.
Moves are tried in order of recomputation cost saved per byte held per stage, best first, until none helps or the
time is up.
"""

from __future__ import annotations

import logging

import numpy as np

from checkmate.graph import Graph
from checkmate.plan import Plan, cheapest_r, make_plan, prune_checkpoints
from checkmate.progress import SearchControl

log = logging.getLogger(__name__)

# Moves evaluated per round before the candidates are ranked again from the new plan.
MOVES_PER_ROUND = 64


def hold_more(graph: Graph, plan: Plan, budget: int, control: SearchControl, *, method: str) -> Plan:
    """Improve `plan` by holding recomputed values where the budget allows (see the module doc)."""
    best = plan
    evaluated = 0
    while not control.stopped:
        improved = False
        for node, first, last in _moves(graph, best)[:MOVES_PER_ROUND]:
            if control.stopped:
                break
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
    log.info("hold more: %d moves evaluated, cost %.6g -> %.6g", evaluated, plan.cost, best.cost)
    return best


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
