"""The LP relaxation of the paper's MILP (eq. 9 with 0 <= R, S <= 1): a lower bound on cost, and the point `approx`
rounds.

Memory is rounded *down* to solver units (`relaxed_scale`), so the bound holds in bytes even when the scaling is not
exact.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from checkmate.bounds.floor import activation_floor
from checkmate.graph import Graph
from checkmate.milp.backends import lp_backend
from checkmate.milp.backends.policy import solver_time_limit, too_little_time
from checkmate.milp.formulation import decode_fractional, encode
from checkmate.milp.problem import SolveOptions, SolveStatus
from checkmate.milp.scaling import memory_scale, relaxed_scale

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Relaxation:
    """The LP relaxation at one budget.

    Attributes:
        bound: a lower bound on the cost of any plan within the budget: the LP's optimum, at least every node once
            (only that trivial bound when the LP did not finish); None when the relaxation has no solution, so no
            schedule fits.
        S_fractional: S* of the solver's last point (for rounding), or None when it had none.
    """

    bound: float | None
    S_fractional: np.ndarray | None


def relaxation(
    graph: Graph,
    budget: int,
    *,
    time_limit: float | None = None,
    should_stop: Callable[[], bool] | None = None,
    interrupted: Callable[[], bool] | None = None,
    load_seconds_per_variable: float = 0.0,
) -> Relaxation:
    """Solve the LP relaxation for `graph` within `budget` bytes (see `Relaxation`). When `time_limit` is below
    `load_seconds_per_variable` times the LP's variables, it is not solved (the solver would overrun the limit
    loading it): the trivial bound, and no point."""
    if budget < activation_floor(graph):
        return Relaxation(None, None)
    scale = relaxed_scale(memory_scale(graph), graph)
    problem, index = encode(graph, scale.budget_units(budget, graph.fixed_memory), scale)
    trivial = graph.least_cost
    if too_little_time(time_limit, problem.num_variables, load_seconds_per_variable):
        log.info(
            "the LP relaxation (%d variables) was not solved: %.2f s is too little", problem.num_variables, time_limit
        )
        return Relaxation(trivial, None)
    solver_limit = solver_time_limit(time_limit, problem.num_variables, load_seconds_per_variable)
    solution = lp_backend().solve(
        problem.relaxed(), SolveOptions(time_limit=solver_limit, should_stop=should_stop, interrupted=interrupted)
    )
    if solution.status is SolveStatus.INFEASIBLE:
        return Relaxation(None, None)
    S_fractional = None if solution.x is None else decode_fractional(solution.x, index)[1]
    if solution.status is not SolveStatus.OPTIMAL or solution.objective is None:
        log.info("the LP relaxation did not finish; using the trivial bound (each node once)")
        return Relaxation(trivial, S_fractional)
    return Relaxation(max(trivial, solution.objective), S_fractional)


def relaxation_bound(graph: Graph, budget: int, *, time_limit: float | None = None) -> float | None:
    """`relaxation(...).bound`: the LP's lower bound on cost within `budget`, None when no schedule fits."""
    return relaxation(graph, budget, time_limit=time_limit).bound
