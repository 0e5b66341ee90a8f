"""Proven bounds: the LP lower bound on cost, and the smallest budget for which any schedule exists.

Both use the MILP of `checkmate.milp.formulation`. The LP bound uses memory rounded *down* to solver units
(`relaxed_scale`), so it is a valid bound in bytes even when the scaling is not exact.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import numpy as np
import scipy.sparse as sp

from checkmate.errors import InfeasibleBudget
from checkmate.graph import Graph
from checkmate.milp.backends import get_backend
from checkmate.milp.formulation import decode, encode, encode_solution, moment_usage
from checkmate.milp.problem import MilpProblem, SolveOptions, SolveStatus
from checkmate.milp.scaling import memory_scale, relaxed_scale
from checkmate.units import format_bytes

log = logging.getLogger(__name__)

MINIMUM_BUDGET_TIME_LIMIT = 10.0
# Above this many nodes the peak-minimising MILP (O(T^2) variables) takes longer to load than its time limit;
# minimum_budget then brackets the minimum by the activation floor and the lowest baseline peak.
MINIMUM_BUDGET_MILP_NODES = 200


@dataclass(frozen=True)
class BudgetRange:
    """The smallest feasible budget lies in [lower, upper] bytes (upper: the peak of a plan found; None if none)."""

    lower: int
    upper: int | None

    @property
    def exact(self) -> bool:
        return self.upper is not None and self.lower >= self.upper


def activation_floor(graph: Graph) -> int:
    """Fixed memory plus the largest node together with its inputs and workspace: no schedule peaks lower (instant)."""
    working_sets = [
        graph.memory[k] + graph.workspace[k] + sum(graph.memory[i] for i in graph.predecessors[k])
        for k in range(graph.size)
    ]
    return graph.fixed_memory + int(max(working_sets, default=0))


def lower_bound(graph: Graph, budget: int, *, time_limit: float | None = None) -> float:
    """The LP relaxation's lower bound on the cost of any plan within `budget` bytes.

    Args:
        graph: the training graph.
        budget: bytes, fixed memory included.
        time_limit: seconds for the LP; when it runs out, the trivial bound (every node once) is returned.

    Raises:
        InfeasibleBudget: when even the relaxation has no solution (no schedule fits), naming the smallest budget.
    """
    if budget < activation_floor(graph):
        raise infeasible_budget(graph, budget, method="lower_bound")
    scale = relaxed_scale(memory_scale(graph), graph)
    problem, _ = encode(graph, scale.budget_units(budget, graph.fixed_memory), scale)
    solution = get_backend("highs").solve(problem.relaxed(), SolveOptions(time_limit=time_limit))
    if solution.status is SolveStatus.INFEASIBLE:
        raise infeasible_budget(graph, budget, method="lower_bound")
    trivial = float(graph.costs.sum())
    if solution.status is not SolveStatus.OPTIMAL or solution.objective is None:
        log.info("the LP did not finish; returning the trivial bound (each node once)")
        return trivial
    return max(trivial, solution.objective)


def minimum_budget(
    graph: Graph, *, time_limit: float = MINIMUM_BUDGET_TIME_LIMIT, backend: str = "highs"
) -> BudgetRange:
    """Bracket the smallest budget for which any schedule exists by minimising the peak with a MILP (graphs of up to
    MINIMUM_BUDGET_MILP_NODES nodes; larger ones get the activation floor and the lowest baseline peak).

    Args:
        graph: the training graph.
        time_limit: seconds for the solve; the range is exact when the solver proves optimality in time.
        backend: the MILP backend.
    """
    from checkmate.plan import make_plan
    from checkmate.strategies.warm_start import lowest_peak_baseline

    floor = activation_floor(graph)
    start_plan = lowest_peak_baseline(graph)
    if start_plan is not None and start_plan.peak_memory <= floor:
        return BudgetRange(lower=floor, upper=start_plan.peak_memory)
    if graph.size > MINIMUM_BUDGET_MILP_NODES:
        return BudgetRange(lower=floor, upper=None if start_plan is None else start_plan.peak_memory)
    scale = memory_scale(graph)
    problem, index = encode(graph, np.inf, scale)
    usage = moment_usage(index)
    peak_problem = _min_peak_problem(problem, usage)
    start = None
    if start_plan is not None:
        x = encode_solution(graph, index, start_plan.R, start_plan.S)
        start = np.append(x, (usage @ x).max())
    options = SolveOptions(time_limit=time_limit, mip_gap=0.0, mip_abs_gap=0.999)  # the peak is whole units
    solution = get_backend(backend).solve(peak_problem, options, start)
    upper = None if start_plan is None else start_plan.peak_memory
    if solution.x is not None:
        R, S = decode(solution.x, index)
        found = make_plan(graph, R, S, method="minimum_budget").peak_memory
        upper = found if upper is None else min(upper, found)
    lower = floor
    if scale.exact and solution.bound is not None:
        lower = max(lower, scale.to_bytes(np.ceil(solution.bound - 1e-6), graph.fixed_memory))
    return BudgetRange(lower=min(lower, upper) if upper is not None else lower, upper=upper)


def _min_peak_problem(problem: MilpProblem, usage: sp.csr_array) -> MilpProblem:
    """Append a peak variable P >= U[t, k] + W_k R[t, k] (every moment's `usage` row) and minimise P, not the cost."""
    n = problem.num_variables
    peak_rows = sp.hstack([usage, sp.csc_array(-np.ones((usage.shape[0], 1)))])
    widened = sp.hstack([problem.A, sp.csc_array((problem.num_constraints, 1))])
    return MilpProblem(
        c=np.append(np.zeros(n), 1.0),
        A=sp.csc_array(sp.vstack([widened, peak_rows])),
        row_lower=np.concatenate([problem.row_lower, np.full(usage.shape[0], -np.inf)]),
        row_upper=np.concatenate([problem.row_upper, np.zeros(usage.shape[0])]),
        col_lower=np.append(problem.col_lower, 0.0),
        col_upper=np.append(problem.col_upper, np.inf),
        integer=np.append(problem.integer, False),
    )


def infeasible_budget(
    graph: Graph, budget: int, *, method: str, time_limit: float = MINIMUM_BUDGET_TIME_LIMIT
) -> InfeasibleBudget:
    """The error for a budget no schedule meets, stating the smallest budget for which one exists."""
    found = minimum_budget(graph, time_limit=time_limit)
    asked = f"{format_bytes(budget)} ({budget} bytes)"
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
            f"within {time_limit:g} s to say how much more is needed"
        )
        return InfeasibleBudget(message, budget=budget, minimum=None)
    message = (
        f"{method}: no schedule fits {asked}. A schedule exists at {format_bytes(found.upper)} ({found.upper} bytes) "
        f"and none below {found.lower} bytes (a bound: the exact minimum was not proven within {time_limit:g} s); "
        f"`minimum` is the budget known to work"
    )
    return InfeasibleBudget(message, budget=budget, minimum=found.upper)
