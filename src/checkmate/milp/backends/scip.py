"""SCIP through pyscipopt. The model travels as an MPS file written by HiGHS's writer from the sparse arrays,
so no Python loop runs over rows; only the warm start and the answer are read per variable."""

from __future__ import annotations

import functools
import importlib.util
import logging
import os
import tempfile
import time
from typing import Any

import numpy as np

from checkmate.errors import SolverUnavailable
from checkmate.milp.backends.highs import to_highs_lp
from checkmate.milp.problem import MilpProblem, MilpSolution, SolveOptions, SolveStatus

log = logging.getLogger(__name__)


class ScipBackend:
    """The SCIP MIP solver (pyscipopt bundles it). Single-threaded: `threads` is ignored."""

    name = "scip"

    @functools.cache  # noqa: B019  (one instance per process; the answer never changes)
    def is_available(self) -> bool:
        return importlib.util.find_spec("pyscipopt") is not None and importlib.util.find_spec("highspy") is not None

    def solve(self, problem: MilpProblem, options: SolveOptions, start: np.ndarray | None = None) -> MilpSolution:
        if not self.is_available():
            raise SolverUnavailable("pyscipopt is not installed: pip install pyscipopt (or choose backend='highs')")
        import pyscipopt

        model = pyscipopt.Model()
        model.hideOutput(quiet=not options.verbose)
        with tempfile.TemporaryDirectory() as folder:
            path = os.path.join(folder, "checkmate.mps")
            _write_mps(problem, path)
            model.readProblem(path)
        _apply_options(model, options)
        columns = _columns_in_order(model, problem.num_variables)
        if start is not None:
            _add_start(model, columns, start)
        started = time.perf_counter()
        model.optimize()
        elapsed = time.perf_counter() - started
        return _read_result(model, columns, elapsed)


def _write_mps(problem: MilpProblem, path: str) -> None:
    import highspy

    highs = highspy.Highs()
    highs.setOptionValue("output_flag", False)
    highs.passModel(to_highs_lp(problem))
    highs.writeModel(path)


def _apply_options(model: Any, options: SolveOptions) -> None:
    model.setParam("limits/gap", options.mip_gap)
    model.setParam("limits/absgap", options.mip_abs_gap)
    model.setParam("randomization/randomseedshift", options.seed)
    if options.time_limit is not None:
        model.setParam("limits/time", float(options.time_limit))


def _columns_in_order(model: Any, count: int) -> list[Any]:
    """SCIP's variables sorted by column number (HiGHS names column j "c{j}")."""
    columns: list[Any] = [None] * count
    for variable in model.getVars():
        columns[int(variable.name[1:])] = variable
    return columns


def _add_start(model: Any, columns: list[Any], start: np.ndarray) -> None:
    solution = model.createSol()
    for variable, value in zip(columns, start.tolist(), strict=True):
        model.setSolVal(solution, variable, value)
    accepted = model.addSol(solution, free=True)
    log.debug("SCIP %s the warm start", "accepted" if accepted else "rejected")


def _read_result(model: Any, columns: list[Any], elapsed: float) -> MilpSolution:
    scip_status = model.getStatus()
    has_solution = model.getNSols() > 0
    x = None
    objective = None
    if has_solution:
        best = model.getBestSol()
        x = np.array([model.getSolVal(best, variable) for variable in columns])
        objective = float(model.getSolObjVal(best))
    if scip_status in ("optimal", "gaplimit"):
        status = SolveStatus.OPTIMAL
    elif scip_status == "infeasible":
        status = SolveStatus.INFEASIBLE
    else:
        status = SolveStatus.FEASIBLE if has_solution else SolveStatus.NO_SOLUTION
        log.info("SCIP stopped with status %s", scip_status)
    bound = float(model.getDualbound())
    return MilpSolution(status, x, objective, bound if np.isfinite(bound) else None, elapsed, "scip")
