"""approx: the paper's two-phase LP rounding (section 5, Algorithm 2), searching the budget allowance ε, with a
local search that repairs and improves the rounded checkpoints (`checkmate.strategies.lp_rounding`). The best
baseline that fits is found first and is the answer where the rounding finds nothing cheaper in its time.

Graphs of more than `SearchPolicy.exact_nodes` nodes are rounded on a coarse graph instead
(`checkmate.strategies.large_graph`), whose plan is expanded and improved on the full graph: no MILP and no
swap_holds, so faster than `optimal`, and usually a little worse.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Sequence
from functools import partial

from checkmate.bounds import activation_floor
from checkmate.errors import InfeasibleBudget
from checkmate.graph import Graph
from checkmate.milp.scaling import DEFAULT_RESOLUTION
from checkmate.plan import Plan, cheapest_fitting, make_plan
from checkmate.progress import ProgressCallback, SearchControl
from checkmate.strategies.checkpoint_all import checkpoint_all
from checkmate.strategies.common import final_plan
from checkmate.strategies.feasibility import infeasible_budget, message_time
from checkmate.strategies.held_start import HeldStart
from checkmate.strategies.large_graph import ExactSearch, Method, search
from checkmate.strategies.lp_rounding import EPSILONS, THRESHOLDS, RoundingSettings, round_relaxation
from checkmate.strategies.policy import POLICY, SearchPolicy
from checkmate.strategies.registry import register
from checkmate.strategies.warm_start import best_baseline

log = logging.getLogger(__name__)

METHOD = "approx"


@register(METHOD, "LP relaxation + two-phase rounding of S (paper section 5), searching ε, with a local-search repair")
def approx(
    graph: Graph,
    budget: int | None,
    *,
    epsilons: Sequence[float] = EPSILONS,
    thresholds: Sequence[float] = THRESHOLDS,
    samples: int = 16,
    seed: int = 0,
    starts: int = 2,
    improve: bool = True,
    time_limit: float | None = None,
    memory_resolution: int = DEFAULT_RESOLUTION,
    progress: ProgressCallback | None = None,
    control: SearchControl | None = None,
    exact_nodes: int | None = None,
    coarse_nodes: int | None = None,
    policy: SearchPolicy = POLICY,
    extra_starts: Sequence[HeldStart] = (),
) -> Plan:
    """Round LP relaxations, improve the best roundings by local search, and return the cheapest plan found.

    Args:
        graph: the training graph.
        budget: bytes, fixed memory included; None means no limit (then checkpoint_all is optimal).
        epsilons, thresholds, samples, seed, starts, improve, memory_resolution: the rounding's settings
            (`checkmate.strategies.lp_rounding.RoundingSettings`).
        time_limit: seconds for the whole call; when they run out, the best plan found so far.
        progress: called with a `checkmate.progress.Progress` whenever the best plan or the bound improves.
        control: the clock and stop flag of a caller that already has one (then time_limit and progress are its).
        exact_nodes: the largest graph rounded as one LP (None: the policy's).
        coarse_nodes: nodes of the coarse graph for larger graphs (None: the policy's).
        policy: how the search spends its time (`checkmate.strategies.policy.SearchPolicy`).
        extra_starts: starting plans given from outside (`checkmate.strategies.held_start.HeldStart`), weighed with
            the baselines: the plan returned costs at most the cheapest of them within the budget.

    Returns:
        The cheapest plan found within the budget, with the LP bound at the full budget as `lower_bound` (the
        retention bound on a large graph).

    Raises:
        InfeasibleBudget: below the activation floor, or when the LP proves that no schedule fits, or when no
            plan was found (in the time limit).
    """
    control = control if control is not None else SearchControl(time_limit=time_limit, callback=progress)
    if budget is None:
        plan = checkpoint_all(graph, None)
        return make_plan(graph, plan.R, plan.S, method=METHOD, status="optimal", lower_bound=plan.cost)
    if budget < activation_floor(graph):
        raise infeasible_budget(graph, budget, method=METHOD, time_limit=message_time(control))
    policy = dataclasses.replace(
        policy,
        exact_nodes=policy.exact_nodes if exact_nodes is None else exact_nodes,
        coarse_nodes=policy.coarse_nodes if coarse_nodes is None else coarse_nodes,
    )
    settings = RoundingSettings(tuple(epsilons), tuple(thresholds), samples, seed, starts, improve, memory_resolution)
    rounding = partial(_rounding, settings=settings, policy=policy)
    starts_given = tuple(extra_starts)
    exact = partial(_rounding_or_baseline, rounding, policy, starts_given)
    method = Method(
        name=METHOD, exact=exact, coarse=rounding, gap=0.0, swap_holds=False, seed=seed, extra_starts=starts_given
    )
    return search(graph, budget, control, method, policy)


def _rounding(
    graph: Graph,
    budget: int,
    control: SearchControl,
    message_time: float,
    *,
    settings: RoundingSettings,
    policy: SearchPolicy,
) -> Plan:
    """`round_relaxation` as `large_graph.Method` calls it."""
    return round_relaxation(graph, budget, control, settings, method=METHOD, message_time=message_time, policy=policy)


def _rounding_or_baseline(
    rounding: ExactSearch,
    policy: SearchPolicy,
    extra_starts: tuple[HeldStart, ...],
    graph: Graph,
    budget: int,
    control: SearchControl,
    message_time: float,
) -> Plan:
    """On a graph rounded as it is: the best baseline or given start that fits (in `starts_share` of the time), then
    the rounding in the rest; the cheaper plan is the answer, the baseline also where the rounding finds none in its
    time."""
    started = time.perf_counter()
    baseline = best_baseline(graph, budget, control.child(control.share(policy.starts_share)), extra_starts)
    if baseline is not None:
        control.report("baselines", cost=baseline.cost)
    try:
        rounded: Plan | None = rounding(graph, budget, control, message_time)
    except InfeasibleBudget as error:
        if baseline is None:
            raise
        log.warning("%s; the best baseline that fits (%s) is the answer", error, baseline.method)
        rounded = None
    best = cheapest_fitting([rounded, baseline], budget)
    assert best is not None
    if best is rounded:
        return best
    bound = None if rounded is None else rounded.lower_bound
    return final_plan(graph, budget, best, bound=bound, started=started, method=METHOD)
