"""The smallest budget for which any schedule exists, and the error that names it when a budget is too small.

Both start from the baselines (the lowest peak any of them reaches is a budget known to work) and tighten with the
peak-minimising MILP of `checkmate.bounds.peak_range`.
"""

from __future__ import annotations

import time

from checkmate.bounds import BudgetRange, activation_floor, peak_range, relaxation_bound
from checkmate.byte_sizes import format_bytes
from checkmate.errors import InfeasibleBudget
from checkmate.graph import Graph
from checkmate.milp.backends.policy import LP_BACKEND
from checkmate.options import SolverName
from checkmate.progress import SearchControl
from checkmate.strategies.policy import POLICY
from checkmate.strategies.warm_start import lowest_peak_baseline

MINIMUM_BUDGET_TIME_LIMIT = 10.0
# Above this many nodes the peak-minimising MILP (O(T^2) variables) takes longer to load than its time limit;
# minimum_budget then brackets the minimum by the activation floor and the lowest baseline peak.
MINIMUM_BUDGET_MILP_NODES = 200


def minimum_budget(
    graph: Graph, *, time_limit: float = MINIMUM_BUDGET_TIME_LIMIT, backend: SolverName = LP_BACKEND
) -> BudgetRange:
    """Bracket the smallest budget for which any schedule exists by minimising the peak with a MILP (graphs of up to
    MINIMUM_BUDGET_MILP_NODES nodes; larger ones get the activation floor and the lowest baseline peak).

    Args:
        graph: the training graph.
        time_limit: seconds for the whole call, the baselines included (0: the activation floor alone); the range is
            exact when the solver proves optimality in time.
        backend: the MILP backend.
    """
    started = time.perf_counter()
    floor = activation_floor(graph)
    if time_limit <= 0:
        return BudgetRange(lower=floor, upper=None)
    start_plan = lowest_peak_baseline(graph, SearchControl(time_limit=time_limit))
    if start_plan is not None and start_plan.peak_memory <= floor:
        return BudgetRange(lower=floor, upper=start_plan.peak_memory)
    left = time_limit - (time.perf_counter() - started)  # the baselines took part of it
    if graph.size > MINIMUM_BUDGET_MILP_NODES or left <= 0:
        return BudgetRange(lower=floor, upper=None if start_plan is None else start_plan.peak_memory)
    return peak_range(
        graph,
        start_plan,
        time_limit=left,
        backend=backend,
        load_seconds_per_variable=POLICY.load_seconds_per_variable,
    )


def lower_bound(graph: Graph, budget: int, *, time_limit: float | None = None) -> float:
    """The LP relaxation's lower bound on the cost of any plan within `budget` bytes.

    Args:
        graph: the training graph.
        budget: bytes, fixed memory included.
        time_limit: seconds for the LP; when it runs out, the trivial bound (every node once) is returned.

    Raises:
        InfeasibleBudget: when even the relaxation has no solution (no schedule fits), naming the smallest budget.
    """
    bound = relaxation_bound(graph, budget, time_limit=time_limit)
    if bound is None:
        raise infeasible_budget(graph, budget, method="lower_bound")
    return bound


def message_time(control: SearchControl) -> float:
    """Seconds the smallest-budget search behind an InfeasibleBudget message may take: what is left of the caller's
    time limit, at most MINIMUM_BUDGET_TIME_LIMIT (0 when it is spent or a stop was asked: the message then says what
    is known)."""
    if control.interrupted:
        return 0.0
    remaining = control.remaining()
    return MINIMUM_BUDGET_TIME_LIMIT if remaining is None else min(MINIMUM_BUDGET_TIME_LIMIT, remaining)


def infeasible_budget(
    graph: Graph, budget: int, *, method: str, time_limit: float = MINIMUM_BUDGET_TIME_LIMIT
) -> InfeasibleBudget:
    """The error for a budget no schedule meets, stating the smallest budget for which one exists as far as
    `time_limit` seconds of search (a caller's `message_time`) can tell."""
    found = minimum_budget(graph, time_limit=time_limit)
    asked = f"{format_bytes(budget)} ({budget} bytes)"
    searched = f"within {time_limit:g} s" if time_limit > 0 else "(the time limit was spent: not searched)"
    if found.exact:
        assert found.upper is not None
        message = (
            f"{method}: no schedule fits {asked}; the smallest budget for which any schedule exists is "
            f"{format_bytes(found.upper)} ({found.upper} bytes). Raise the budget to at least that"
        )
        return InfeasibleBudget(message, budget=budget, minimum=found.upper)
    if found.upper is None:
        message = (
            f"{method}: no schedule fits {asked}; none exists below {found.lower} bytes, and no schedule was found "
            f"{searched} to say how much more is needed"
        )
        return InfeasibleBudget(message, budget=budget, minimum=None)
    message = (
        f"{method}: no schedule fits {asked}. A schedule exists at {format_bytes(found.upper)} ({found.upper} bytes) "
        f"and none below {found.lower} bytes (a bound: the exact minimum was not proven {searched}); "
        f"`minimum` is the budget known to work"
    )
    return InfeasibleBudget(message, budget=budget, minimum=found.upper)


def in_fraction_of_peak(error: InfeasibleBudget, fraction: float, no_remat_peak: int) -> InfeasibleBudget:
    """`error` for a budget the caller gave as `fraction` of the `no_remat_peak`: its message names that fraction
    beside the bytes, and the smallest budget known to work as a fraction too; same `budget` and `minimum`."""
    asked = (
        f"budget {fraction:g} of the no-recomputation peak {format_bytes(no_remat_peak)} ({format_bytes(error.budget)})"
    )
    if error.minimum is not None and error.minimum > error.budget and no_remat_peak > 0:
        asked += (
            f" is below the smallest budget known to work, {format_bytes(error.minimum)} "
            f"({_fraction_at_least(error.minimum, no_remat_peak)} of the peak)"
        )
    return InfeasibleBudget(f"{asked}: {error}", budget=error.budget, minimum=error.minimum)


def _fraction_at_least(minimum: int, peak: int) -> str:
    """The fraction of `peak`, to two places, rounded up so that passing it back gives at least `minimum` bytes
    (three places when two round up to more than the peak's whole)."""
    for places in (2, 3, 4):
        scale = 10**places
        value = -(-minimum * scale // peak) / scale
        if value <= 1.0 and int(value * peak) >= minimum:
            return f"{value:.{places}f}"
    return f"{minimum / peak:.6f}"
