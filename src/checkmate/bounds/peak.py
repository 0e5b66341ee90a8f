"""A bracket of the smallest feasible budget around a given plan: the peak-minimising MILP.

What uses the strategies (baselines as starting plans, the errors that name the smallest budget) is in
`checkmate.strategies.feasibility`.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass

import numpy as np
import scipy.sparse as sp

from checkmate.bounds.floor import activation_floor
from checkmate.graph import Graph
from checkmate.milp.backends import get_backend
from checkmate.milp.backends.policy import LP_BACKEND, solver_time_limit, too_little_time
from checkmate.milp.formulation import (
    decode,
    decode_presence,
    encode,
    encode_solution,
    moment_retained,
    moment_usage,
)
from checkmate.milp.problem import MilpProblem, SolveOptions
from checkmate.milp.scaling import memory_scale
from checkmate.options import SolverName
from checkmate.plan import Plan, make_plan

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class BudgetRange:
    """The smallest feasible budget lies in [lower, upper] bytes (upper: the peak of a plan found; None if none)."""

    lower: int
    upper: int | None

    @property
    def exact(self) -> bool:
        return self.upper is not None and self.lower >= self.upper


def peak_range(
    graph: Graph,
    start_plan: Plan | None,
    *,
    time_limit: float,
    backend: SolverName = LP_BACKEND,
    load_seconds_per_variable: float = 0.0,
) -> BudgetRange:
    """Bracket the smallest budget for which any schedule exists by minimising the peak with a MILP that starts from
    `start_plan` (its peak is already a budget that works).

    Args:
        graph: the training graph.
        start_plan: a plan to start from, or None.
        time_limit: seconds for the call, building the problem included; the range is exact when the solver
            proves optimality in time.
        backend: the MILP backend.
        load_seconds_per_variable: the MILP is not solved when less time is left than this times its variables
            (the solver would overrun the limit loading it); the range is then the floor and the start's peak.
            Otherwise the solver's own limit is what is left after that load time.
    """
    started = time.perf_counter()
    scale = memory_scale(graph)
    problem, index = encode(graph, np.inf, scale)
    usage, retained = moment_usage(index), moment_retained(index)
    peak_problem = _min_peak_problem(problem, usage, retained)
    start = None
    if start_plan is not None:
        x = encode_solution(graph, index, start_plan.R, start_plan.S, start_plan.presence)
        start = np.append(x, (usage @ x + retained).max())
    left = max(0.0, time_limit - (time.perf_counter() - started))  # building the problem took part of the time
    upper = None if start_plan is None else start_plan.peak_memory
    floor = activation_floor(graph)
    if too_little_time(left, peak_problem.num_variables, load_seconds_per_variable):
        log.info(
            "the peak-minimising MILP (%d variables) not solved: %.2f s is too little", peak_problem.num_variables, left
        )
        return BudgetRange(lower=floor, upper=upper)
    limit = solver_time_limit(left, peak_problem.num_variables, load_seconds_per_variable)
    options = SolveOptions(time_limit=limit, mip_gap=0.0, mip_abs_gap=0.999)  # the peak is whole units
    solution = get_backend(backend).solve(peak_problem, options, start)
    if solution.x is not None:
        R, S = decode(solution.x, index)
        found = make_plan(graph, R, S, method="minimum_budget", presence=decode_presence(solution.x, index)).peak_memory
        upper = found if upper is None else min(upper, found)
    lower = floor
    if scale.exact and solution.bound is not None:
        lower = max(lower, scale.to_bytes(np.ceil(solution.bound - 1e-6), graph.fixed_memory))
    return BudgetRange(lower=min(lower, upper) if upper is not None else lower, upper=upper)


def _min_peak_problem(problem: MilpProblem, usage: sp.csr_array, retained: np.ndarray) -> MilpProblem:
    """Append a peak variable P >= U[t, k] + W_k R[t, k] + retained(t, k) (every moment's `usage` row and what is
    retained then) and minimise P, not the cost."""
    n = problem.num_variables
    peak_rows = sp.hstack([usage, sp.csc_array(-np.ones((usage.shape[0], 1)))])
    widened = sp.hstack([problem.A, sp.csc_array((problem.num_constraints, 1))])
    return MilpProblem(
        c=np.append(np.zeros(n), 1.0),
        A=sp.csc_array(sp.vstack([widened, peak_rows])),
        row_lower=np.concatenate([problem.row_lower, np.full(usage.shape[0], -np.inf)]),
        row_upper=np.concatenate([problem.row_upper, -retained]),
        col_lower=np.append(problem.col_lower, 0.0),
        col_upper=np.append(problem.col_upper, np.inf),
        integer=np.append(problem.integer, False),
    )
