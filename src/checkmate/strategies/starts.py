"""The plans a search starts from, and the bound it starts with.

The starting points, each but the moved ones improved by `hold_more` on the full graph:
* the cheapest baseline within the budget (Chen's heuristics, checkpoint_all, griewank), and the cheapest of the
  starts the caller gives (`checkmate.strategies.held_start`: torch.compile's partitioner's choices, for the Inductor
  executor);
* the answer of the closure bound (`checkmate.strategies.closure_start`): hold what crosses the binding stage as it
  holds, rebuild the rest once. Where one stage binds it meets the bound: proven optimal at once on most of the
  graph set's rows (transformers among them);
* on a graph with a host link, plans that recompute less and move values to host memory to fit
  (`checkmate.strategies.offload_starts`);
* unless a start already meets the bound, the answers of the retention bound (`checkmate.bounds.retention`), without
  and with its input cover: hold what it keeps, recompute the rest with the cheapest R. On convolutional networks
  this lands within a fraction of a percent of the bound (on VGG16 the answer with the cover is the optimum); on
  transformers its recomputations cascade and the other starts win.
The search's first proven lower bound is the larger of the retention bound and the closure bound
(`checkmate.bounds.closure`: what crosses the stage where memory binds must be held there or rebuilt after it, with
its inputs; on transformers it is the tighter one). On a graph with a host link both price memory in recomputation
alone; its bound is the closure bound with moves (`checkmate.bounds.moved_closure`) instead.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TypeVar

from checkmate.bounds.closure import closure_bound
from checkmate.bounds.moved_closure import moved_closure_bound
from checkmate.bounds.retention import retention_bound
from checkmate.errors import InfeasibleBudget
from checkmate.graph import Graph
from checkmate.plan import Plan, cheapest_fitting, cheapest_r, make_plan, prune_checkpoints
from checkmate.progress import SearchControl
from checkmate.strategies.closure_start import closure_start
from checkmate.strategies.feasibility import infeasible_budget
from checkmate.strategies.held_start import HeldStart
from checkmate.strategies.hold_more import hold_more
from checkmate.strategies.offload_starts import moved_starts
from checkmate.strategies.policy import POLICY, SearchPolicy
from checkmate.strategies.warm_start import best_baseline, best_given

log = logging.getLogger(__name__)

Found = TypeVar("Found")

# The retention answer is improved only when it costs at most this much more than the improved baseline: on
# transformers it starts at many times the no-remat cost and hold_more cannot repair that in useful time.
SEED_SLACK = 1.5


@dataclass(frozen=True)
class Starts:
    """What a search starts with.

    Attributes:
        best: the cheapest starting plan within the budget, or None when none fits.
        bound: a proven lower bound on the cost of any plan within the budget (at least each node once).
        bound_is_final: True when `bound` is the retention MILP's optimum: more time would not raise it.
    """

    best: Plan | None
    bound: float
    bound_is_final: bool = False


def starting_plans(
    graph: Graph,
    budget: int,
    control: SearchControl,
    *,
    method: str,
    time_share: float,
    message_time: float,
    policy: SearchPolicy = POLICY,
    extra_starts: Sequence[HeldStart] = (),
) -> Starts:
    """The best of the starting points (see the module doc) and the retention bound, in `time_share` of the time
    `control` has left; `message_time`: seconds the error of an infeasible budget may spend naming the smallest
    budget; `extra_starts`: starting plans given from outside, weighed with the baselines."""
    clock = control.child(control.share(time_share))
    plans: list[Plan] = []
    # the baselines on the caller's clock (a start matters more than the share); the given starts' best is improved
    # apart, so that a given start never replaces the improved baseline the search would have had without it
    for phase, first in (
        ("baselines", best_baseline(graph, budget, control)),
        ("given starts", best_given(graph, budget, extra_starts)),
    ):
        if first is None:
            continue
        improving = clock.child(clock.share(policy.baseline_improvement_share))
        plans.append(hold_more(graph, first, budget, improving, method=method, policy=policy))
        clock.report(phase, cost=plans[-1].cost)
    bound = graph.least_cost
    bound_is_final = False

    def failure() -> Exception:
        return infeasible_budget(graph, budget, method=method, time_limit=message_time)

    # On a graph with a host link the retention and closure machinery runs on the graph without it, for its starting
    # plans alone (none moves a value): its bounds price memory in recomputation alone, and its proof that no plan
    # fits does not hold where values can move instead, so neither is taken.
    plain = dataclasses.replace(graph, host_link=None) if graph.host_link is not None else graph
    try:
        if not clock.stopped:
            load = policy.load_seconds_per_variable

            def stopped() -> bool:
                return clock.stopped

            def interrupted() -> bool:
                return clock.interrupted

            def searched(bound_of: Callable[..., Found], share: float) -> Found:
                """A bound's search on the graph, in `share` of the time left; `failure` where it proves that no
                plan fits."""
                time_limit = clock.share(share, minimum=policy.retention_minimum)
                return _or_infeasible(
                    lambda: bound_of(
                        plain,
                        budget,
                        time_limit=time_limit,
                        load_seconds_per_variable=load,
                        should_stop=stopped,
                        interrupted=interrupted,
                    ),
                    failure,
                )

            found = searched(retention_bound, policy.retention_share)
            if plain is graph:
                bound = max(bound, found.bound)
                bound_is_final = found.proven
            clock.report("retention bound", bound=bound)
            closure = searched(closure_bound, policy.closure_share)
            if plain is graph:
                bound = max(bound, closure.bound)
            clock.report("closure bound", bound=bound)
            seed = None
            if not clock.stopped:
                seed = closure_start(
                    plain,
                    budget,
                    closure,
                    method=method,
                    time_limit=clock.share(policy.closure_share),
                    should_stop=stopped,
                    interrupted=interrupted,
                )
            if seed is not None and seed.peak_memory <= budget:
                plans.append(hold_more(graph, seed, budget, clock.child(None), method=method, policy=policy))
                clock.report("closure start", cost=plans[-1].cost)
            for held in (found.held, found.held_with_cover):
                best = cheapest_fitting(plans, budget)
                if held is None or clock.stopped or (best is not None and policy.meets(best.cost, bound)):
                    continue
                R, S = prune_checkpoints(graph, cheapest_r(graph, held), held)
                seed = make_plan(graph, R, S, method=method)
                promising = not plans or seed.cost <= SEED_SLACK * min(plan.cost for plan in plans)
                if seed.peak_memory <= budget and promising:
                    plans.append(hold_more(graph, seed, budget, clock.child(None), method=method, policy=policy))
                    clock.report("retention start", cost=plans[-1].cost)
    except InfeasibleBudget:
        if plain is graph:
            raise
    if plain is not graph and not control.stopped:
        time_limit = control.share(policy.moved_bound_share, minimum=policy.retention_minimum)
        answer = moved_closure_bound(
            graph,
            budget,
            time_limit=time_limit,
            load_seconds_per_variable=policy.load_seconds_per_variable,
            should_stop=lambda: control.stopped,
            interrupted=lambda: control.interrupted,
        )
        bound = max(bound, answer.bound)
        control.report("moved closure bound", bound=bound)
        starting = control.child(control.share(policy.moved_starts_share))
        moved = moved_starts(graph, budget, starting, method=method, answer=answer)
        if moved is not None:
            plans.append(moved)
            control.report("moved starts", cost=moved.cost)
    best = cheapest_fitting(plans, budget)
    log.info("starting plan: %s; bound %.6g", "none" if best is None else f"cost {best.cost:.6g}", bound)
    return Starts(best, bound, bound_is_final)


def _or_infeasible(solve: Callable[[], Found], failure: Callable[[], Exception]) -> Found:
    """What `solve` returns; when it proves that no plan fits, the error `failure` makes (which names the smallest
    budget) instead."""
    try:
        return solve()
    except InfeasibleBudget:
        raise failure() from None
