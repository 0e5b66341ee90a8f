"""HiGHS through highspy: the model is passed as CSC arrays in one call.

Progress and stopping (`SolveOptions.on_progress` / `should_stop`) go through highspy's callbacks. During branch and
bound, HiGHS calls the MIP interrupt callback every few tenths of a second (it is where `should_stop` is polled and
where the primal and dual bounds are reported, at most once a second) and the improving-solution callback at each
new incumbent (reported at once). HiGHS calls no callback while it presolves or solves the root LP relaxation of a
MIP, so a stop asked then takes effect when branch and bound starts (or at `time_limit`): the solve runs in a worker
thread that the caller stops waiting on (`checkmate.milp.backends.detached`). A pure LP polls
`should_stop` from the simplex and IPM interrupt callbacks (once per iteration, checked every LP_POLL_INTERVAL
seconds). An exception raised by a hook (KeyboardInterrupt included) stops the solve and is raised again once HiGHS
has returned: HiGHS would otherwise swallow it and report a solve error.
"""

from __future__ import annotations

import contextlib
import functools
import importlib.util
import logging
import os
import sys
import time
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np

from checkmate.errors import SolverUnavailable
from checkmate.milp.backends.base import SolverHooks
from checkmate.milp.backends.detached import solve_detached
from checkmate.milp.problem import MilpProblem, MilpSolution, SolveOptions, SolveStatus
from checkmate.options import SolverName

log = logging.getLogger(__name__)


class HighsBackend:
    """The HiGHS MIP and LP solver (bundled with the package)."""

    name: SolverName = "highs"

    @functools.cache  # noqa: B019  (one instance per process; the answer never changes)
    def is_available(self) -> bool:
        return importlib.util.find_spec("highspy") is not None

    def solve(self, problem: MilpProblem, options: SolveOptions, start: np.ndarray | None = None) -> MilpSolution:
        if not self.is_available():
            raise SolverUnavailable("highspy is not installed: pip install highspy (or choose backend='scip')")
        return solve_detached(lambda detached: self._solve(problem, detached, start), options, "HiGHS")

    def _solve(self, problem: MilpProblem, options: SolveOptions, start: np.ndarray | None) -> MilpSolution:
        import highspy

        with _stdout_silenced(not options.verbose):
            highs = highspy.Highs()
        _apply_options(highs, options)
        highs.passModel(to_highs_lp(problem))
        is_mip = bool(problem.integer.any())
        if start is not None and is_mip:
            highs.setSolution(_solution_of(highspy, start))
        hooks = _Hooks(options.on_progress, options.should_stop)
        hooks.attach(highs, is_mip)
        started = time.perf_counter()
        highs.run()
        elapsed = time.perf_counter() - started
        hooks.raise_if_failed()
        return _read_result(highspy, highs, is_mip, elapsed)


# Poll should_stop from the per-iteration LP interrupt callbacks at most this often (seconds).
LP_POLL_INTERVAL = 0.05


def _finite(value: float) -> float | None:
    value = float(value)
    return value if np.isfinite(value) else None


class _Hooks(SolverHooks):
    """The hooks wired to highspy's callbacks (subscribed only when given); a hook's exception interrupts the solve
    at the next interrupt callback."""

    def __init__(
        self,
        on_progress: Callable[[float | None, float | None], None] | None,
        should_stop: Callable[[], bool] | None,
    ) -> None:
        super().__init__(on_progress, should_stop)
        self.last_poll = -float("inf")

    def attach(self, highs: Any, is_mip: bool) -> None:
        if is_mip:
            if self.on_progress is not None:
                highs.cbMipImprovingSolution += self._improving_solution
            if self.active:
                highs.cbMipInterrupt += self._mip_interrupt
        elif self.should_stop is not None:
            highs.cbSimplexInterrupt += self._lp_interrupt
            highs.cbIpmInterrupt += self._lp_interrupt

    def _improving_solution(self, event: Any) -> None:
        if self.stop:
            return
        try:
            data = event.data_out
            self.report(_finite(data.objective_function_value), _finite(data.mip_dual_bound), new_incumbent=True)
        except BaseException as error:  # re-raised after run(); HiGHS would swallow it
            self.fail(error)

    def _mip_interrupt(self, event: Any) -> None:
        if not self.stop:
            try:
                data = event.data_out
                self.report(_finite(data.mip_primal_bound), _finite(data.mip_dual_bound))
                self.poll_stop("HiGHS")
            except BaseException as error:  # re-raised after run(); HiGHS would swallow it
                self.fail(error)
        if self.stop:
            event.interrupt()

    def _lp_interrupt(self, event: Any) -> None:
        if not self.stop and self.should_stop is not None:
            now = time.perf_counter()
            if now - self.last_poll < LP_POLL_INTERVAL:
                return
            self.last_poll = now
            try:
                self.poll_stop("HiGHS")
            except BaseException as error:  # re-raised after run(); HiGHS would swallow it
                self.fail(error)
        if self.stop:
            event.interrupt()


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
    """The problem as a highspy HighsLp, built from CSC arrays."""
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
    else:  # time limit, interrupt (should_stop), ...: the incumbent if there is one
        status = SolveStatus.FEASIBLE if has_solution else SolveStatus.NO_SOLUTION
        log.info("HiGHS stopped with %s", highs.modelStatusToString(model_status))
    if is_mip:
        bound = float(info.mip_dual_bound) if np.isfinite(info.mip_dual_bound) else None
    else:
        bound = objective if status is SolveStatus.OPTIMAL else None
    return MilpSolution(status, x, objective, bound, elapsed, "highs")
