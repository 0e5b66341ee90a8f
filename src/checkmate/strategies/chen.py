"""Chen et al. (2016) √n and greedy checkpointing, generalised to branching graphs as in the paper (§6.1, App. B).

Each variant picks a checkpoint set among candidates, fixes S from it (`segments.checkpoint_s`) and derives the
cheapest R for that S (App. B.1). The candidates are the articulation points of the forward graph, the values
flowing from the batch to the loss (`segments.articulation_points`; `chen_sqrtn`, `chen_greedy`), or every forward
node of the linearised, topologically ordered forward graph (`chen_sqrtn_linear`, `chen_greedy_linear`). On a
chain both candidate sets are every forward node.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Sequence

import numpy as np

from checkmate.graph import Graph
from checkmate.plan import Plan, cheapest_r, make_plan
from checkmate.progress import SearchControl
from checkmate.simulate import plan_cost
from checkmate.strategies.common import cheapest_within, fits, plan_from_s
from checkmate.strategies.registry import register
from checkmate.strategies.segments import (
    articulation_points,
    checkpoint_s,
    every_kth,
    forward_nodes,
    greedy_checkpoints,
)

log = logging.getLogger(__name__)

# Chen's greedy segment budget b is searched over the √n segment memory times these factors (Checkmate's grid).
GREEDY_FACTORS = 1.0 + np.arange(-1.0, 2.0, 0.05)


def sqrtn_plan(graph: Graph, budget: int | None, *, candidates: list[int], method: str) -> Plan:
    """Checkpoint every k-th candidate, k = int(√|candidates|)."""
    chosen = every_kth(candidates, int(math.sqrt(len(candidates))))
    plan = plan_from_s(graph, checkpoint_s(graph, chosen), method=method)
    return cheapest_within([plan], budget, method=method)


def greedy_plan(
    graph: Graph,
    budget: int | None,
    *,
    candidates: list[int],
    method: str,
    segment_budgets: Sequence[float] | None = None,
    control: SearchControl | None = None,
) -> Plan:
    """Run Chen's greedy rule for each segment budget b and return the cheapest plan within the budget.

    Args:
        graph: the training graph.
        budget: bytes (fixed memory included), or None for the cheapest plan of all.
        candidates: forward nodes that may become checkpoints.
        method: the name the plans carry.
        segment_budgets: the values of b to try; default: the √n segment memory times `GREEDY_FACTORS`.
        control: a caller's clock: once it stops, no more values of b are tried and no more plans are priced or
            simulated (the answer is then the best of those simulated, at least one; on a large graph doing them all
            takes a while).
    """
    if segment_budgets is None:
        segment_budgets = default_segment_budgets(graph)
    checkpoint_sets: dict[tuple[int, ...], None] = {}  # in the order of b, without repeats
    for b in segment_budgets:
        if checkpoint_sets and control is not None and control.stopped:
            log.info("%s: time is up after %d of %d values of b", method, len(checkpoint_sets), len(segment_budgets))
            break
        checkpoint_sets.setdefault(tuple(greedy_checkpoints(graph, candidates, b)))
    log.debug("%s: %d values of b give %d checkpoint sets", method, len(segment_budgets), len(checkpoint_sets))
    return cheapest_of_checkpoint_sets(graph, budget, list(checkpoint_sets), method=method, control=control)


def cheapest_of_checkpoint_sets(
    graph: Graph,
    budget: int | None,
    checkpoint_sets: list[tuple[int, ...]],
    *,
    method: str,
    control: SearchControl | None = None,
) -> Plan:
    """The cheapest plan within the budget among checkpoint sets, simulating in order of cost until one fits.

    The cost of a fixed-S plan is known from R alone; only the peak needs the (slower) simulation, so plans are
    simulated cheapest first, and all of them only when none fits (to name the smallest peak in the error). Once
    `control` stops, no more sets are priced and no more plans simulated (at least one is).
    """
    candidates: list[tuple[float, np.ndarray, np.ndarray]] = []
    for chosen in checkpoint_sets:
        if candidates and control is not None and control.stopped:
            log.info(
                "%s: time is up after pricing %d of %d checkpoint sets", method, len(candidates), len(checkpoint_sets)
            )
            break
        S = checkpoint_s(graph, chosen)
        R = cheapest_r(graph, S)
        candidates.append((plan_cost(graph, R), R, S))
    candidates.sort(key=lambda candidate: candidate[0])
    plans: list[Plan] = []
    for cost, R, S in candidates:
        if plans and cost > plans[-1].cost and any(fits(plan, budget) for plan in plans):
            break
        if plans and control is not None and control.stopped:
            log.info("%s: time is up after %d of %d plans", method, len(plans), len(candidates))
            break
        plans.append(make_plan(graph, R, S, method=method))
    return cheapest_within(plans, budget, method=method)


def default_segment_budgets(graph: Graph) -> list[float]:
    """The √n segment memory (forward bytes / √(forward nodes)) times each of `GREEDY_FACTORS`."""
    forward = forward_nodes(graph)
    if not forward:
        return [0.0]
    segment_memory = float(graph.memory[forward].sum()) / math.sqrt(len(forward))
    return [segment_memory * factor for factor in GREEDY_FACTORS]


@register("chen_sqrtn", "Chen et al. √n: checkpoint every √n-th articulation point of the forward graph")
def chen_sqrtn(graph: Graph, budget: int | None) -> Plan:
    return sqrtn_plan(graph, budget, candidates=articulation_points(graph), method="chen_sqrtn")


@register("chen_sqrtn_linear", "Chen et al. √n on the linearised forward graph: checkpoint every √n-th forward node")
def chen_sqrtn_linear(graph: Graph, budget: int | None) -> Plan:
    return sqrtn_plan(graph, budget, candidates=forward_nodes(graph), method="chen_sqrtn_linear")


@register("chen_greedy", "Chen et al. greedy over articulation points, searching the segment size b for the budget")
def chen_greedy(
    graph: Graph,
    budget: int | None,
    *,
    segment_budgets: Sequence[float] | None = None,
    control: SearchControl | None = None,
) -> Plan:
    return greedy_plan(
        graph,
        budget,
        candidates=articulation_points(graph),
        method="chen_greedy",
        segment_budgets=segment_budgets,
        control=control,
    )


@register("chen_greedy_linear", "Chen et al. greedy on the linearised forward graph, searching b for the budget")
def chen_greedy_linear(
    graph: Graph,
    budget: int | None,
    *,
    segment_budgets: Sequence[float] | None = None,
    control: SearchControl | None = None,
) -> Plan:
    return greedy_plan(
        graph,
        budget,
        candidates=forward_nodes(graph),
        method="chen_greedy_linear",
        segment_budgets=segment_budgets,
        control=control,
    )
