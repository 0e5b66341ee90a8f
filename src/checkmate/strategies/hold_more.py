"""Local search on the full graph: spend memory the plan leaves unused on holding values it recomputes.

A plan made on a coarse graph (or by a heuristic) often peaks well below the budget. Each move holds a value the
plan recomputes over a span of stages instead (`LocalSearch.holds`: from where it was last available, or from its
first computation, through a later recomputation). R is then the cheapest for the new checkpoints (the
recomputations the held copy serves disappear, with those of ancestors that only fed them), unused checkpoints are
dropped, and the search's accounting decides: a move is kept when the plan gets cheaper and still fits the budget.
Moves are tried in order of recomputation cost saved per byte held per stage, best first, until none helps or the
time is up; a move whose value would not fit beside the peak of a stage it is held through is not tried.
"""

from __future__ import annotations

import logging

import numpy as np

from checkmate.graph import Graph
from checkmate.plan import Plan
from checkmate.progress import SearchControl
from checkmate.strategies.local_search import LocalSearch, SearchState
from checkmate.strategies.policy import POLICY, SearchPolicy

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
    policy: SearchPolicy = POLICY,
) -> Plan:
    """Improve `plan` by holding recomputed values where the budget allows (see the module doc); nodes in
    `excluded` are left as they are. Never returns a plan costlier than `plan`."""
    search = LocalSearch(graph, budget, control, policy)
    start = search.state(plan.S)
    if start.excess > 0:
        log.debug("hold more: the cheapest R for the plan's checkpoints does not fit; plan kept")
        return plan
    best = _descend(search, start, excluded)
    if not policy.cheaper(best.cost, plan.cost):
        return plan
    log.debug("hold more: %d plans evaluated, cost %.6g -> %.6g", search.evaluations, plan.cost, best.cost)
    return search.state_plan(best, method=method)


def _descend(search: LocalSearch, state: SearchState, excluded: frozenset[int]) -> SearchState:
    """First-improvement descent over hold moves, ranked afresh after each move taken."""
    memory, control, policy = search.memory, search.control, search.policy
    while not control.stopped:
        room = search.budget - state.stage_peaks
        tried = 0
        improved = False
        for move in search.holds(state, from_first_computation=True):
            node, first, last = move
            if control.stopped or tried >= MOVES_PER_ROUND:
                break
            if node in excluded:
                continue
            if first < last and room[first:last].min() < memory[node]:
                continue  # held through those stages, it would not fit beside their peaks
            tried += 1
            candidate = search.derive(state, search.held(state, move))
            if candidate.excess == 0 and policy.cheaper(candidate.cost, state.cost):
                state, improved = candidate, True
                control.report("hold more", cost=state.cost)
                break
        if not improved:
            break
    return state


def swap_holds(
    graph: Graph,
    plan: Plan,
    budget: int,
    control: SearchControl,
    *,
    method: str,
    seed: int = 0,
    policy: SearchPolicy = POLICY,
) -> Plan:
    """Iterated local search: drop every hold of a few held nodes (drawn with weight bytes x stages held), let
    `hold_more` spend the freed memory on other nodes, and keep the result when it is cheaper; until time is up or
    `SWAP_ATTEMPTS` drops in a row gave nothing."""
    if control.stopped:
        return plan
    search = LocalSearch(graph, budget, control, policy)
    best = search.state(plan.S)
    if best.excess > 0 or policy.cheaper(plan.cost, best.cost):
        return plan
    rng = np.random.default_rng(seed)
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
        start = search.derive(best, S)
        candidate = _descend(search, start, frozenset(int(node) for node in dropped))
        if candidate.excess == 0 and policy.cheaper(candidate.cost, best.cost):
            best, failures = candidate, 0
            control.report("swap holds", cost=best.cost)
        else:
            failures += 1
    log.info("swap holds: cost %.6g -> %.6g", plan.cost, best.cost)
    return search.state_plan(best, method=method) if policy.cheaper(best.cost, plan.cost) else plan


def _weights(held: np.ndarray, candidates: np.ndarray) -> np.ndarray:
    weights = held[candidates].astype(np.float64)
    return weights / weights.sum()
