"""approx: the paper's two-phase LP rounding (section 5, Algorithm 2), with a search over the budget allowance ε.

For each ε the LP relaxation is solved at (1 - ε) of the activation budget; only S is rounded (a deterministic
threshold sweep, seeded randomized rounding S ~ Bernoulli(S*), and seeded rounding with one uniform threshold per
node, which keeps a node's checkpoints consistent across stages: on unit chains it roughly halves the excess cost of
independent rounding); R is the cheapest for that S (App. B.1);
the cheapest plan within the full budget is kept. The paper fixes ε = 0.1 and names a search over ε as future work.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator, Sequence

import numpy as np

from checkmate.bounds import activation_floor, infeasible_budget, lower_bound
from checkmate.graph import Graph
from checkmate.milp.backends import get_backend
from checkmate.milp.formulation import decode_fractional, encode
from checkmate.milp.problem import SolveOptions
from checkmate.milp.scaling import DEFAULT_RESOLUTION, MemoryScale, memory_scale
from checkmate.plan import Plan, cheapest_r, make_plan
from checkmate.strategies.checkpoint_all import checkpoint_all
from checkmate.strategies.common import infeasible
from checkmate.strategies.registry import register

log = logging.getLogger(__name__)

METHOD = "approx"
EPSILONS = (0.0, 0.05, 0.1, 0.2, 0.3, 0.5)
THRESHOLDS = (0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9)


@register(METHOD, "LP relaxation + two-phase rounding of S (paper section 5), searching the budget allowance ε")
def approx(
    graph: Graph,
    budget: int | None,
    *,
    epsilons: Sequence[float] = EPSILONS,
    thresholds: Sequence[float] = THRESHOLDS,
    samples: int = 16,
    seed: int = 0,
    time_limit: float | None = None,
    memory_resolution: int = DEFAULT_RESOLUTION,
) -> Plan:
    """Round LP relaxations to the cheapest plan found within `budget` bytes.

    Args:
        graph: the training graph.
        budget: bytes, fixed memory included; None means no limit (then checkpoint_all is optimal).
        epsilons: budget allowances to try: the LP is solved at (1 - ε) of the activation budget.
        thresholds: deterministic rounding thresholds: S = [S* >= threshold].
        samples: randomized roundings of each kind per ε (seeded by `seed`).
        time_limit: seconds for each LP.
        memory_resolution: at most this many memory units for the largest node (see checkmate.milp.scaling).

    Returns:
        The cheapest rounded plan within the budget, with the LP bound at the full budget as `lower_bound`.
    """
    started = time.perf_counter()
    if budget is None:
        plan = checkpoint_all(graph, None)
        return make_plan(graph, plan.R, plan.S, method=METHOD, status="optimal", lower_bound=plan.cost)
    if budget < activation_floor(graph):
        raise infeasible_budget(graph, budget, method=METHOD)
    bound = lower_bound(graph, budget, time_limit=time_limit)
    scale = memory_scale(graph, memory_resolution)
    rng = np.random.default_rng(seed)
    best: Plan | None = None
    seen: set[bytes] = set()
    for epsilon in epsilons:
        for S in _roundings(graph, budget, epsilon, scale, thresholds, samples, rng, time_limit):
            if S.tobytes() in seen:
                continue
            seen.add(S.tobytes())
            plan = make_plan(graph, cheapest_r(graph, S), S, method=METHOD)
            if plan.peak_memory <= budget and (best is None or plan.cost < best.cost):
                best = plan
        if best is not None and best.cost <= bound + 1e-9:
            break
    if best is None:
        raise infeasible(METHOD, budget, None, hint="no rounding fits; try method='optimal' or a larger budget")
    proven = best.cost <= bound + 1e-9
    return make_plan(
        graph,
        best.R,
        best.S,
        method=METHOD,
        solve_time=time.perf_counter() - started,
        budget=budget,
        status="optimal" if proven else "feasible",
        lower_bound=min(bound, best.cost),
    )


def _roundings(
    graph: Graph,
    budget: int,
    epsilon: float,
    scale: MemoryScale,
    thresholds: Sequence[float],
    samples: int,
    rng: np.random.Generator,
    time_limit: float | None,
) -> Iterator[np.ndarray]:
    """The rounded S matrices of the LP relaxation at (1 - epsilon) of the activation budget."""
    activation = (1.0 - epsilon) * (budget - graph.fixed_memory)
    problem, index = encode(
        graph, float(scale.budget_units(int(activation) + graph.fixed_memory, graph.fixed_memory)), scale
    )
    solution = get_backend("highs").solve(problem.relaxed(), SolveOptions(time_limit=time_limit))
    if solution.x is None:
        log.info("approx: the LP at ε = %g has no solution (%s)", epsilon, solution.status.value)
        return
    _, S_fractional = decode_fractional(solution.x, index)
    for threshold in thresholds:
        yield S_fractional >= threshold - 1e-9
    for _ in range(samples):
        yield rng.random(S_fractional.shape) < S_fractional  # Appendix D: S ~ Bernoulli(S*)
    for _ in range(samples):
        yield S_fractional >= rng.random(graph.size)[None, :]  # one threshold per node: its checkpoints stay in step
