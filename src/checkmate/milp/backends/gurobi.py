"""Gurobi through gurobipy's matrix API. Optional: used only when installed and asked for (backend="gurobi")."""

from __future__ import annotations

import functools
import importlib.util
import logging
import time
from typing import Any

import numpy as np

from checkmate.errors import SolverUnavailable
from checkmate.milp.problem import MilpProblem, MilpSolution, SolveOptions, SolveStatus
from checkmate.options import SolverName

log = logging.getLogger(__name__)


class GurobiBackend:
    """Gurobi. `is_available` only looks for the package; the licence is checked when a solve starts."""

    name: SolverName = "gurobi"

    @functools.cache  # noqa: B019  (one instance per process; the answer never changes)
    def is_available(self) -> bool:
        return importlib.util.find_spec("gurobipy") is not None

    def solve(self, problem: MilpProblem, options: SolveOptions, start: np.ndarray | None = None) -> MilpSolution:
        if not self.is_available():
            raise SolverUnavailable("gurobipy is not installed: pip install gurobipy (needs a licence), or use 'highs'")
        import gurobipy

        try:
            model = _build(gurobipy, problem, options)
        except gurobipy.GurobiError as error:
            raise SolverUnavailable(f"Gurobi cannot start ({error}); check the licence or use backend='scip'") from None
        variables = model.getVars()
        if start is not None:
            model.setAttr("Start", variables, start.tolist())
        started = time.perf_counter()
        try:
            model.optimize()
        except gurobipy.GurobiError as error:
            raise SolverUnavailable(
                f"Gurobi stopped while solving ({error}); a size-limited licence refuses models of more than 2000 "
                "variables: use backend='highs' or 'scip'"
            ) from None
        return _read_result(gurobipy, model, time.perf_counter() - started)


def _build(gurobipy: Any, problem: MilpProblem, options: SolveOptions) -> Any:
    model = gurobipy.Model()
    model.Params.OutputFlag = int(options.verbose)
    model.Params.MIPGap = options.mip_gap
    model.Params.MIPGapAbs = options.mip_abs_gap
    model.Params.Seed = options.seed
    if options.time_limit is not None:
        model.Params.TimeLimit = float(options.time_limit)
    if options.threads is not None:
        model.Params.Threads = int(options.threads)
    types = np.where(problem.integer, "B", "C")
    types[problem.integer & (problem.col_upper > 1)] = "I"
    x = model.addMVar(problem.num_variables, lb=problem.col_lower, ub=problem.col_upper, obj=problem.c, vtype=types)
    A = problem.A.tocsr()
    finite_upper = np.isfinite(problem.row_upper)
    finite_lower = np.isfinite(problem.row_lower)
    model.addMConstr(A[finite_upper], x, "<", problem.row_upper[finite_upper])
    model.addMConstr(A[finite_lower], x, ">", problem.row_lower[finite_lower])
    model.ModelSense = 1
    return model


def _read_result(gurobipy: Any, model: Any, elapsed: float) -> MilpSolution:
    codes = gurobipy.GRB.Status
    status_code = model.Status
    has_solution = model.SolCount > 0
    x = np.array(model.getAttr("X", model.getVars())) if has_solution else None
    objective = float(model.ObjVal) if has_solution else None
    if status_code == codes.OPTIMAL:
        status = SolveStatus.OPTIMAL
    elif status_code in (codes.INFEASIBLE, codes.INF_OR_UNBD):
        status = SolveStatus.INFEASIBLE
    else:
        status = SolveStatus.FEASIBLE if has_solution else SolveStatus.NO_SOLUTION
    is_mip = bool(model.IsMIP)
    bound = float(model.ObjBound) if is_mip and has_solution else objective
    return MilpSolution(status, x, objective, bound, elapsed, "gurobi")
