"""Plan a graph too large for one MILP: coarsen, solve, expand, improve on the full graph.

1. The starting plans on the full graph (`checkmate.strategies.starts`: the best baseline and the retention bound's
   answer, each improved by `hold_more`) and the retention bound.
2. `checkmate.coarsen`: merge neighbouring nodes into at most `blocks` blocks, with conservative memory.
3. The paper's MILP on the coarse graph (`solve_milp`), warm-started from the coarse baselines, with backward
   nodes computed once (a restriction that halves the model; optimal plans of real graphs rarely recompute them).
4. Expand the coarse plan to the full graph (it costs no more and peaks no higher), then `hold_more` spends the
   memory the coarse accounting left unused.
5. The rest of the time goes to `swap_holds` on the best plan so far (drop some holds, hold others instead).
6. The lower bound for the full graph is the retention bound (`checkmate.milp.retention_bound`); the coarse MILP's
   bound is not one.

Every plan is built through the simulator; the cheapest that fits is returned.
"""

from __future__ import annotations

import dataclasses
import logging
import time

from checkmate.coarsen import choose_partition, coarsen, expand_plan
from checkmate.errors import InfeasibleBudget
from checkmate.graph import Graph
from checkmate.plan import Plan
from checkmate.progress import SearchControl
from checkmate.strategies.hold_more import hold_more, swap_holds
from checkmate.strategies.optimal import MilpSettings, final_plan, solve_milp
from checkmate.strategies.starts import starting_plans
from checkmate.strategies.warm_start import unproven_infeasibility
from checkmate.units import format_bytes

log = logging.getLogger(__name__)

# Coarse graph size: SCIP (in the portfolio that backend="auto" runs) proves GPT-2 small's 150-block coarse MILP
# (47k variables) optimal in 15 s, where HiGHS alone does not improve on its warm start in 220 s (BENCHMARKS.md).
DEFAULT_BLOCKS = 150
# Shares of the time left: the starting plans and the retention bound, then the coarse MILP; the rest goes to
# expanding, hold_more and swap_holds.
STARTS_SHARE = 0.3
COARSE_SHARE = 0.5


def coarsened_optimal(
    graph: Graph,
    budget: int,
    control: SearchControl,
    settings: MilpSettings,
    *,
    blocks: int | None,
    method: str,
) -> Plan:
    """The cheapest plan found within `budget` through a coarse graph of `blocks` nodes (see the module doc)."""
    started = time.perf_counter()
    starts = starting_plans(graph, budget, control, method=method, time_share=STARTS_SHARE)
    candidates = [] if starts.best is None else [starts.best]
    if not control.stopped and not _proven(candidates, starts.bound, settings.mip_gap):
        candidates.extend(_through_coarse_graph(graph, budget, control, settings, blocks or DEFAULT_BLOCKS, method))
    best = _cheapest(graph, budget, candidates)
    if not _proven([best], starts.bound, settings.mip_gap):
        best = swap_holds(graph, best, budget, control.child(None), method=method, seed=settings.seed)
    return _final(graph, budget, best, starts.bound, settings.mip_gap, started, control, method)


def _proven(plans: list[Plan], bound: float, gap: float) -> bool:
    """Whether one of the plans already meets the bound (within `gap`): nothing left to search for."""
    return any(plan.cost <= bound * (1 + gap) + 1e-9 for plan in plans)


def coarsened_approx(
    graph: Graph, budget: int, control: SearchControl, *, blocks: int | None, method: str, seed: int
) -> Plan:
    """`approx` for a large graph: the starting plans, then the paper's LP rounding on the coarse graph, expanded
    and improved by hold_more. No MILP and no swap_holds: faster than `optimal`, and usually a little worse."""
    from checkmate.strategies.approx import approx

    started = time.perf_counter()
    starts = starting_plans(graph, budget, control, method=method, time_share=STARTS_SHARE)
    candidates = [] if starts.best is None else [starts.best]
    if not control.stopped and not _proven(candidates, starts.bound, 0.0):
        coarsening = coarsen(graph, choose_partition(graph, blocks or DEFAULT_BLOCKS))
        try:
            coarse_plan = approx(
                coarsening.coarse,
                budget,
                seed=seed,
                exact_nodes=coarsening.coarse.size,
                control=control.child(control.share(COARSE_SHARE), reports=False),
            )
        except InfeasibleBudget as error:
            log.info("approx on the coarse graph found no plan within the budget: %s", error)
        else:
            expanded = expand_plan(coarsening, coarse_plan, method=method)
            candidates.append(hold_more(graph, expanded, budget, control.child(None), method=method))
    return _final(graph, budget, _cheapest(graph, budget, candidates), starts.bound, 0.0, started, control, method)


def _cheapest(graph: Graph, budget: int, candidates: list[Plan]) -> Plan:
    fitting = [plan for plan in candidates if plan.peak_memory <= budget]
    if not fitting:
        raise _nothing_found(graph, budget)
    return min(fitting, key=lambda plan: (plan.cost, plan.peak_memory))


def _final(
    graph: Graph,
    budget: int,
    best: Plan,
    bound: float,
    gap: float,
    started: float,
    control: SearchControl,
    method: str,
) -> Plan:
    """The plan with its bound, "optimal" when the bound meets its cost (within `gap`)."""
    final = final_plan(
        graph, budget, best, proven=_proven([best], bound, gap), bound=bound, started=started, method=method
    )
    control.report("done", cost=final.cost, bound=final.lower_bound)
    return final


def _through_coarse_graph(
    graph: Graph, budget: int, control: SearchControl, settings: MilpSettings, blocks: int, method: str
) -> list[Plan]:
    """The coarse MILP's plan, expanded and improved by hold_more (none when the coarse graph has no plan)."""
    coarsening = coarsen(graph, choose_partition(graph, blocks))
    log.info("coarse graph: %d nodes for %d", coarsening.coarse.size, graph.size)
    try:
        coarse_plan = solve_milp(
            coarsening.coarse,
            budget,
            control,
            dataclasses.replace(settings, recompute_backward=False),
            method=method,
            phase="coarse MILP",
            time_limit=control.share(COARSE_SHARE),
            proves=False,
        )
    except InfeasibleBudget as error:
        log.info("the coarse graph has no plan within the budget: %s", error)
        return []
    expanded = expand_plan(coarsening, coarse_plan, method=method)
    control.report("expanded", cost=expanded.cost)
    return [hold_more(graph, expanded, budget, control.child(None), method=method)]


def _nothing_found(graph: Graph, budget: int) -> InfeasibleBudget:
    return unproven_infeasibility(
        graph,
        budget,
        f"no plan within {format_bytes(budget)} ({budget} bytes) was found on the coarse graph or by any baseline",
        "Raise the budget, the time limit or coarse_nodes",
    )
