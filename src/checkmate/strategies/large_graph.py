"""Search a graph of any size: exactly when it is small, through a coarse graph when it is large.

A graph of at most `SearchPolicy.exact_nodes` nodes goes to the method's exact search as it is. A larger one:

1. The starting plans on the full graph (`checkmate.strategies.starts`: the best baseline and the retention bound's
   answer, each improved by `hold_more`) and the lower bound: the larger of the retention and closure bounds.
2. `checkmate.coarsen`: merge neighbouring nodes into at most `coarse_nodes` nodes, with conservative memory.
3. The method's exact search on the coarse graph (the MILP for `optimal`, the LP rounding for `approx`), skipped
   when the budget is below the coarse graph's activation floor.
4. Expand the coarse plan to the full graph (it costs no more and peaks no higher), then `hold_more` spends the
   memory the coarse accounting left unused.
5. If the method asks for it, the rest of the time goes to `swap_holds` on the best plan so far (drop some holds,
   hold others instead).
6. With a time limit, what `swap_holds` leaves goes to steps 2-5 again on finer coarse graphs (`refine_factor` times
   as many nodes each time), the cheaper plan kept. A finer partition merges less, so its conservative memory costs
   less recomputation.
7. The lower bound for the full graph is the larger of the retention bound (`checkmate.bounds.retention`) and the
   closure bound (`checkmate.bounds.closure`); the coarse search's bound is not one. When the starts' share of the
   time did not let the retention MILP finish and the plan is not yet proven, steps 5 and 6 leave `final_bound_share` of
   its time to solving it again (on large transformers the input cover's MILP needs more than the starts' share).

Every plan is built through the simulator; the cheapest that fits is returned, "optimal" when the bound meets its
cost (the search stops earlier, within the method's gap, with the gap on the plan).
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass

from checkmate.bounds import activation_floor, retention_bound
from checkmate.byte_sizes import format_bytes
from checkmate.coarsen import choose_partition, coarsen, expand_plan
from checkmate.errors import InfeasibleBudget
from checkmate.fetched import fetches
from checkmate.graph import Graph
from checkmate.plan import Plan, cheapest_fitting
from checkmate.progress import SearchControl
from checkmate.strategies.checkpoint_all import checkpoint_all
from checkmate.strategies.common import final_plan
from checkmate.strategies.feasibility import message_time
from checkmate.strategies.held_start import HeldStart
from checkmate.strategies.hold_more import hold_more, swap_holds
from checkmate.strategies.policy import SearchPolicy
from checkmate.strategies.starts import starting_plans
from checkmate.strategies.warm_start import best_baseline, unproven_infeasibility

log = logging.getLogger(__name__)

# The baselines that answer a search which found no plan get this long, within what is left of its time limit.
RESCUE_SECONDS = 0.8

# A method's exact search on one graph: (graph, budget, control, message_time) -> the plan, or InfeasibleBudget.
# `message_time` is what the error of an infeasible budget may spend naming the smallest budget (0: nothing).
ExactSearch = Callable[[Graph, int, SearchControl, float], Plan]


@dataclass(frozen=True)
class Method:
    """A method as the size dispatch sees it.

    Attributes:
        name: the name its plans carry.
        exact: its search on a graph small enough to solve as it is.
        coarse: its search on a coarse graph.
        gap: the relative gap within which a plan counts as proven optimal.
        swap_holds: whether a large graph's plan is polished by `swap_holds` with the time left.
        seed: seeds `swap_holds`.
        extra_starts: starting plans given from outside the search (`checkmate.strategies.held_start`), weighed with
            the baselines on the full graph (`exact` is given them by the method; the coarse graph has other nodes).
    """

    name: str
    exact: ExactSearch
    coarse: ExactSearch
    gap: float
    swap_holds: bool
    seed: int = 0
    extra_starts: tuple[HeldStart, ...] = ()


def search(graph: Graph, budget: int, control: SearchControl, method: Method, policy: SearchPolicy) -> Plan:
    """The method's plan for `graph` within `budget` bytes, exact or through a coarse graph by size (module doc).

    A budget that holds every value (the peak of checkpoint_all) needs no search when it also fetches each fetched
    value at most once: computing each node once is the least any plan costs. When the search finds nothing in its
    time (or is stopped first), a baseline that fits is the answer, if the baselines find one in what is left of the
    time limit (at most RESCUE_SECONDS)."""
    started = time.perf_counter()
    everything = checkpoint_all(graph, None)
    if everything.peak_memory <= budget and (fetches(everything.presence) <= 1).all():
        control.report("done", cost=everything.cost, bound=everything.cost)
        return final_plan(graph, budget, everything, bound=everything.cost, started=started, method=method.name)
    try:
        if graph.size <= policy.exact_nodes:
            return method.exact(graph, budget, control, message_time(control))
        return _through_coarse_graph(graph, budget, control, method, policy)
    except InfeasibleBudget as error:
        if error.minimum is not None and error.minimum > budget:
            raise  # the lowest peak known is over the budget: no baseline fits
        left = control.remaining()
        rescue_time = RESCUE_SECONDS if left is None else min(RESCUE_SECONDS, left)
        rescue = best_baseline(graph, budget, SearchControl(time_limit=rescue_time), method.extra_starts)
        if rescue is None:
            raise
        log.warning(
            "%s found no plan in its time; the best baseline that fits (%s) is the answer", method.name, rescue.method
        )
        final = final_plan(graph, budget, rescue, bound=None, started=started, method=method.name)
        control.report("baselines", cost=final.cost)
        return final


def _through_coarse_graph(
    graph: Graph, budget: int, control: SearchControl, method: Method, policy: SearchPolicy
) -> Plan:
    started = time.perf_counter()
    starts = starting_plans(
        graph,
        budget,
        control,
        method=method.name,
        time_share=policy.large_starts_share,
        message_time=message_time(control),
        policy=policy,
        extra_starts=method.extra_starts,
    )
    candidates = [starts.best]
    if not control.stopped and not (starts.best and policy.meets(starts.best.cost, starts.bound, method.gap)):
        candidates.append(_coarse_plan(graph, budget, control, method, policy))
    best = cheapest_fitting(candidates, budget)
    if best is None:
        raise unproven_infeasibility(
            graph,
            budget,
            f"no plan within {format_bytes(budget)} ({budget} bytes) was found on the coarse graph or by any baseline",
            "Raise the budget, the time limit or coarse_nodes",
            message_time=message_time(control),
        )
    if method.swap_holds and not policy.meets(best.cost, starts.bound, method.gap):
        swap_time = None if starts.bound_is_final else control.share(1 - policy.final_bound_share)
        best = swap_holds(
            graph, best, budget, control.child(swap_time), method=method.name, seed=method.seed, policy=policy
        )
        refine_time = None if starts.bound_is_final else control.share(1 - policy.final_bound_share)
        best = _finer_coarse_plans(graph, budget, control.child(refine_time), method, policy, best, starts.bound)
    bound = starts.bound
    left = control.remaining()
    worth_it = (left is None or left >= policy.retention_minimum) and graph.host_link is None  # see `starts`
    if worth_it and not (starts.bound_is_final or control.stopped or policy.meets(best.cost, bound, method.gap)):
        found = retention_bound(
            graph, budget, time_limit=control.remaining(), load_seconds_per_variable=policy.load_seconds_per_variable
        )
        bound = max(bound, found.bound)
        control.report("retention bound", bound=bound)
    final = final_plan(graph, budget, best, bound=bound, started=started, method=method.name)
    control.report("done", cost=final.cost, bound=final.lower_bound)
    return final


def _finer_coarse_plans(
    graph: Graph, budget: int, control: SearchControl, method: Method, policy: SearchPolicy, best: Plan, bound: float
) -> Plan:
    """Step 6 of the module doc: while a time limit leaves at least `SearchPolicy.refine_minimum` seconds and `best`
    is not proven, the coarse search again on a partition of `refine_factor` times as many nodes, its plan polished
    by `swap_holds` and kept when cheaper."""
    nodes = policy.coarse_nodes
    while True:
        nodes = int(nodes * policy.refine_factor)
        left = control.remaining()
        if left is None or left < policy.refine_minimum or nodes >= graph.size or control.stopped:
            return best
        if policy.meets(best.cost, bound, method.gap):
            return best
        log.info("a finer coarse graph: %d nodes, %.1f s left", nodes, left)
        finer = _coarse_plan(graph, budget, control, method, dataclasses.replace(policy, coarse_nodes=nodes))
        if finer is None or finer.peak_memory > budget or not policy.cheaper(finer.cost, best.cost):
            continue
        best = swap_holds(
            graph, finer, budget, control.child(None), method=method.name, seed=method.seed, policy=policy
        )
        control.report("finer coarse graph", cost=best.cost)


def _coarse_plan(
    graph: Graph, budget: int, control: SearchControl, method: Method, policy: SearchPolicy
) -> Plan | None:
    """The exact search's plan on the coarse graph, expanded and improved by hold_more (None when the coarse graph
    has no plan within the budget)."""
    coarsening = coarsen(graph, choose_partition(graph, policy.coarse_nodes))
    coarse = coarsening.coarse
    log.info("coarse graph: %d nodes for %d", coarse.size, graph.size)
    if budget < activation_floor(coarse):
        log.info("the budget is below the coarse graph's activation floor (%d bytes): no coarse plan", budget)
        return None
    try:
        coarse_plan = method.coarse(
            coarse, budget, control.child(control.share(policy.coarse_share), reports=False), 0.0
        )
    except InfeasibleBudget as error:
        log.info("the coarse graph has no plan within the budget: %s", error)
        return None
    expanded = expand_plan(coarsening, coarse_plan, method=method.name)
    control.report("expanded", cost=expanded.cost)
    return hold_more(graph, expanded, budget, control.child(None), method=method.name, policy=policy)
