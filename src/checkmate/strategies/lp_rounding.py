"""The paper's two-phase LP rounding (section 5, Algorithm 2) on one graph, searching the budget allowance ε, with a
local search that repairs and improves the rounded checkpoints.

For each ε the LP relaxation is solved at (1 - ε) of the activation budget (ε = 0 is the LP of the lower bound);
only S is rounded (a deterministic threshold sweep, seeded randomized rounding S ~ Bernoulli(S*), and seeded
rounding with one uniform threshold per node, which keeps a node's checkpoints consistent across stages); R is the
cheapest for that S (App. B.1). The paper fixes ε = 0.1 and names a search over ε as future work.

Rounding alone lands far above the optimum on small chains (the rounded checkpoints are each plausible but do not
fit together; `benchmarks/approx_quality.py`) and near the smallest feasible budget often finds no plan at all.
So the best roundings of each ε, within the budget or not, are repaired into the budget and improved by
`checkmate.strategies.local_search` (R always the cheapest for S, held values that nothing reads dropped).

The whole call shares one clock (the caller's `SearchControl`): the LP of the bound gets most of the time left,
each other LP what is left, the search stops when the time is up, and the best plan so far is returned.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np

from checkmate.bounds import relaxation
from checkmate.graph import Graph
from checkmate.milp.backends import lp_backend
from checkmate.milp.formulation import decode_fractional, encode
from checkmate.milp.problem import SolveOptions
from checkmate.milp.scaling import DEFAULT_RESOLUTION, MemoryScale, memory_scale
from checkmate.plan import Plan, make_plan, proven_status
from checkmate.progress import SearchControl
from checkmate.strategies.checkpoint_all import checkpoint_all
from checkmate.strategies.common import infeasible
from checkmate.strategies.feasibility import infeasible_budget
from checkmate.strategies.local_search import LocalSearch, SearchState
from checkmate.strategies.policy import POLICY, SearchPolicy

log = logging.getLogger(__name__)

EPSILONS = (0.0, 0.1, 0.3)
THRESHOLDS = (0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9)


@dataclass(frozen=True)
class RoundingSettings:
    """The options of `approx`'s rounding.

    Attributes:
        epsilons: budget allowances to try: the LP is solved at (1 - ε) of the activation budget.
        thresholds: deterministic rounding thresholds: S = [S* >= threshold].
        samples: randomized roundings of each kind per ε (seeded by `seed`).
        seed: seeds the randomized roundings.
        starts: local searches per ε: from the cheapest rounding within the budget, then from the roundings over it
            (repaired first), least excess first.
        improve: False gives the paper's rounding alone, unused checkpoints dropped (no local search; at tight
            budgets often no plan).
        memory_resolution: at most this many memory units for the largest node (see checkmate.milp.scaling).
    """

    epsilons: Sequence[float] = EPSILONS
    thresholds: Sequence[float] = THRESHOLDS
    samples: int = 16
    seed: int = 0
    starts: int = 2
    improve: bool = True
    memory_resolution: int = DEFAULT_RESOLUTION


def round_relaxation(
    graph: Graph,
    budget: int,
    control: SearchControl,
    settings: RoundingSettings,
    *,
    method: str,
    message_time: float,
    policy: SearchPolicy = POLICY,
) -> Plan:
    """Round LP relaxations of `graph` within `budget` bytes, improve the best roundings by local search, and return
    the cheapest plan found, with the LP bound at the full budget as `lower_bound`.

    Args:
        message_time: seconds the error of an infeasible budget may spend finding the smallest budget (0: none).

    Raises:
        InfeasibleBudget: when the LP proves that no schedule fits, or when no plan was found (in the time limit).
    """
    search = LocalSearch(graph, budget, control, policy)
    lp = relaxation(
        graph,
        budget,
        time_limit=control.share(policy.relaxation_share),
        should_stop=lambda: control.stopped,
        interrupted=lambda: control.interrupted,
        load_seconds_per_variable=policy.load_seconds_per_variable,
    )
    if lp.bound is None:
        raise infeasible_budget(graph, budget, method=method, time_limit=message_time)
    bound = lp.bound
    control.report(f"{method}: LP bound", bound=bound)
    scale = memory_scale(graph, settings.memory_resolution)
    rng = np.random.default_rng(settings.seed)
    seen: set[bytes] = set()  # the rounded S evaluated
    pool: dict[bytes, _Rounding] = {}  # their plans, by the bytes of S with unused checkpoints dropped
    tried: set[bytes] = set()  # the keys of pool that a local search started from
    best: SearchState | None = None

    def consider(state: SearchState | None) -> None:
        nonlocal best
        if state is None or state.excess > 0 or (best is not None and not policy.cheaper(state.cost, best.cost)):
            return
        best = state
        control.report(method, cost=best.cost, bound=bound)

    def proven() -> bool:
        return best is not None and policy.meets(best.cost, bound)

    search.on_better = consider
    start = search.state(checkpoint_all(graph, None).S)  # the rounding of the LP without a budget: hold everything
    pool[start.key] = _Rounding(start.S, start.cost, start.excess)
    consider(start)
    for epsilon in settings.epsilons:
        if control.stopped or proven():
            break
        S_fractional = lp.S_fractional if epsilon == 0 else _relaxation(graph, budget, epsilon, scale, control, policy)
        if S_fractional is None:
            continue
        for S in _roundings(graph, S_fractional, settings, rng, policy):
            if control.stopped:
                break
            if S.tobytes() not in seen:
                seen.add(S.tobytes())
                state = search.state(S)
                pool.setdefault(state.key, _Rounding(state.S, state.cost, state.excess))
                consider(state)
        if settings.improve:
            for rounding in _starts(pool, tried, settings.starts):
                if control.stopped or proven():
                    break
                consider(search.run(search.state(rounding.S)))
    if settings.improve and not control.stopped and best is None:
        for rounding in _starts(pool, tried, len(pool)):  # nothing fits yet: repair every rounding, best first
            for bridges in (True, False):  # without bridges the repair's choices differ, and sometimes fit
                if control.stopped or best is not None:
                    break
                consider(search.run(search.state(rounding.S), bridges=bridges))
    if best is None:
        if control.interrupted:
            reason = "stopped (interrupted) before a plan was found"
        elif control.stopped:
            reason = f"the time limit ({control.time_limit:g} s) was reached before a plan was found"
        else:
            reason = "no plan found"
        raise infeasible(method, budget, None, hint=f"{reason}; try method='optimal' or a larger budget")
    plan = search.state_plan(best, method=method)
    log.info("%s: cost %.6g, bound %.6g, %d plans evaluated", method, plan.cost, bound, search.evaluations)
    return make_plan(
        graph,
        plan.R,
        plan.S,
        method=method,
        solve_time=control.elapsed,
        budget=budget,
        status=proven_status(plan.cost, bound),
        lower_bound=min(bound, plan.cost),
    )


def _relaxation(
    graph: Graph, budget: int, epsilon: float, scale: MemoryScale, control: SearchControl, policy: SearchPolicy
) -> np.ndarray | None:
    """S* of the LP relaxation at (1 - epsilon) of the activation budget (None when the LP gives no point or there
    is too little time left to load it)."""
    activation = (1.0 - epsilon) * (budget - graph.fixed_memory)
    problem, index = encode(
        graph, float(scale.budget_units(int(activation) + graph.fixed_memory, graph.fixed_memory)), scale
    )
    if policy.too_little_time(control.remaining(), problem.num_variables):
        return None
    time_limit = policy.solver_time_limit(control.remaining(), problem.num_variables)
    options = SolveOptions(
        time_limit=time_limit, should_stop=lambda: control.stopped, interrupted=lambda: control.interrupted
    )
    solution = lp_backend().solve(problem.relaxed(), options)
    if solution.x is None:
        log.info("the LP at ε = %g has no solution (%s)", epsilon, solution.status.value)
        return None
    return decode_fractional(solution.x, index)[1]


def _roundings(
    graph: Graph,
    S_fractional: np.ndarray,
    settings: RoundingSettings,
    rng: np.random.Generator,
    policy: SearchPolicy,
) -> Iterator[np.ndarray]:
    """The rounded S matrices of one LP solution S*."""
    for threshold in settings.thresholds:
        yield S_fractional >= threshold - policy.cost_tolerance
    for _ in range(settings.samples):
        yield rng.random(S_fractional.shape) < S_fractional  # Appendix D: S ~ Bernoulli(S*)
    for _ in range(settings.samples):
        yield S_fractional >= rng.random(graph.size)[None, :]  # one threshold per node: its checkpoints stay in step


class _Rounding(NamedTuple):
    """A rounded S (unused checkpoints dropped) with its plan's cost and excess over the budget."""

    S: np.ndarray
    cost: float
    excess: int


def _starts(pool: dict[bytes, _Rounding], tried: set[bytes], count: int) -> list[_Rounding]:
    """Up to `count` untried starting points: the cheapest plan within the budget, then the plans over it, least
    excess first (closest to fitting: repairing the cheapest ones, which hold nearly everything, ends alike)."""
    fresh = [rounding for key, rounding in pool.items() if key not in tried]
    within = sorted((s for s in fresh if s.excess == 0), key=lambda s: s.cost)
    over = sorted((s for s in fresh if s.excess > 0), key=lambda s: (s.excess, s.cost))
    chosen = (within[:1] + over + within[1:])[:count]
    tried.update(rounding.S.tobytes() for rounding in chosen)
    return chosen
