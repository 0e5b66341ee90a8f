"""HiGHS through highspy: the model is passed as CSC arrays in one call."""

from __future__ import annotations

import contextlib
import functools
import importlib.util
import logging
import os
import sys
import time
from collections.abc import Iterator
from typing import Any

import numpy as np

from checkmate.errors import SolverUnavailable
from checkmate.milp.problem import MilpProblem, MilpSolution, SolveOptions, SolveStatus

log = logging.getLogger(__name__)


class HighsBackend:
    """The HiGHS MIP and LP solver (bundled with the package)."""

    name = "highs"

    @functools.cache  # noqa: B019  (one instance per process; the answer never changes)
    def is_available(self) -> bool:
        return importlib.util.find_spec("highspy") is not None

    def solve(self, problem: MilpProblem, options: SolveOptions, start: np.ndarray | None = None) -> MilpSolution:
        if not self.is_available():
            raise SolverUnavailable("highspy is not installed: pip install highspy (or choose backend='scip')")
        import highspy

        with _stdout_silenced(not options.verbose):
            highs = highspy.Highs()
        _apply_options(highs, options)
        highs.passModel(to_highs_lp(problem))
        is_mip = bool(problem.integer.any())
        if start is not None and is_mip:
            highs.setSolution(_solution_of(highspy, start))
        started = time.perf_counter()
        highs.run()
        elapsed = time.perf_counter() - started
        return _read_result(highspy, highs, is_mip, elapsed)


@contextlib.contextmanager
def _stdout_silenced(silence: bool) -> Iterator[None]:
    """HiGHS prints its banner from C on construction, before any option can turn output off: hide file 1 then."""
    if not silence:
        yield
        return
    sys.stdout.flush()
    saved = os.dup(1)
    try:
        with open(os.devnull, "w") as devnull:
            os.dup2(devnull.fileno(), 1)
            yield
    finally:
        os.dup2(saved, 1)
        os.close(saved)


def _apply_options(highs: Any, options: SolveOptions) -> None:
    settings: dict[str, object] = {
        "output_flag": options.verbose,
        "mip_rel_gap": options.mip_gap,
        "mip_abs_gap": options.mip_abs_gap,
        "random_seed": options.seed,
    }
    if options.time_limit is not None:
        settings["time_limit"] = float(options.time_limit)
    if options.threads is not None:
        settings["threads"] = int(options.threads)
    for key, value in settings.items():
        highs.setOptionValue(key, value)


def to_highs_lp(problem: MilpProblem) -> Any:
    """The problem as a highspy HighsLp, built from CSC arrays (shared with the SCIP adapter's MPS writer)."""
    import highspy

    lp = highspy.HighsLp()
    A = problem.A.tocsc()
    lp.num_col_ = problem.num_variables
    lp.num_row_ = problem.num_constraints
    lp.col_cost_ = problem.c
    lp.col_lower_ = problem.col_lower
    lp.col_upper_ = problem.col_upper
    lp.row_lower_ = problem.row_lower
    lp.row_upper_ = problem.row_upper
    lp.a_matrix_.format_ = highspy.MatrixFormat.kColwise
    lp.a_matrix_.start_ = A.indptr.astype(np.int32)
    lp.a_matrix_.index_ = A.indices.astype(np.int32)
    lp.a_matrix_.value_ = A.data.astype(np.float64)
    if problem.integer.any():
        var_type = highspy.HighsVarType
        lp.integrality_ = [var_type.kInteger if flag else var_type.kContinuous for flag in problem.integer]
    return lp


def _solution_of(highspy: Any, x: np.ndarray) -> Any:
    solution = highspy.HighsSolution()
    solution.col_value = x.tolist()
    solution.value_valid = True
    return solution


def _read_result(highspy: Any, highs: Any, is_mip: bool, elapsed: float) -> MilpSolution:
    model_status = highs.getModelStatus()
    statuses = highspy.HighsModelStatus
    info = highs.getInfo()
    has_solution = info.primal_solution_status == 2  # kSolutionStatusFeasible
    x = np.array(highs.getSolution().col_value) if has_solution else None
    objective = float(info.objective_function_value) if has_solution else None
    if model_status == statuses.kOptimal:
        status = SolveStatus.OPTIMAL
    elif model_status == statuses.kInfeasible:
        status = SolveStatus.INFEASIBLE
    else:
        status = SolveStatus.FEASIBLE if has_solution else SolveStatus.NO_SOLUTION
        log.info("HiGHS stopped with %s", highs.modelStatusToString(model_status))
    if is_mip:
        bound = float(info.mip_dual_bound) if np.isfinite(info.mip_dual_bound) else None
    else:
        bound = objective if status is SolveStatus.OPTIMAL else None
    return MilpSolution(status, x, objective, bound, elapsed, "highs")
