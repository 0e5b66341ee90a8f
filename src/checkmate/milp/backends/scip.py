"""SCIP through pyscipopt. The model travels as an MPS file (`checkmate.milp.mps`), which SCIP's reader loads faster
than a model built through pyscipopt's Python API; the warm start and the answer are read per variable.

Progress and stopping (`SolveOptions.on_progress` / `should_stop`) go through an event handler: a new incumbent
(BESTSOLFOUND) is reported at once, and after each solved node or LP (NODESOLVED, LPSOLVED) the primal and dual
bounds are reported at most once a second and `should_stop` is polled; when it returns True the handler calls
`interruptSolve()` and SCIP returns its incumbent. No event arrives while SCIP presolves or solves one LP, so a stop
asked then takes effect at the next event (or at `time_limit`), and a watchdog thread interrupts it sooner. The
solve runs in a worker thread that the caller stops waiting on (`checkmate.milp.backends.detached`), with SCIP's own
Ctrl-C handler turned off (misc/catchctrlc), so Ctrl-C reaches Python's handler (for example `checkmate.progress.
stop_on_interrupt`) at once. An exception raised by a hook interrupts the solve and is raised again once SCIP has
returned.
"""

from __future__ import annotations

import contextlib
import functools
import importlib.util
import logging
import os
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np

from checkmate.errors import SolverUnavailable
from checkmate.milp.backends.base import SolverHooks
from checkmate.milp.backends.detached import solve_detached
from checkmate.milp.mps import write_mps
from checkmate.milp.problem import MilpProblem, MilpSolution, SolveOptions, SolveStatus
from checkmate.options import SolverName

log = logging.getLogger(__name__)


class ScipBackend:
    """The SCIP MIP solver (pyscipopt bundles it). Single-threaded: `threads` is ignored."""

    name: SolverName = "scip"

    @functools.cache  # noqa: B019  (one instance per process; the answer never changes)
    def is_available(self) -> bool:
        return importlib.util.find_spec("pyscipopt") is not None

    def solve(self, problem: MilpProblem, options: SolveOptions, start: np.ndarray | None = None) -> MilpSolution:
        if not self.is_available():
            raise SolverUnavailable("pyscipopt is not installed: pip install pyscipopt (or choose backend='highs')")
        return solve_detached(lambda detached: self._solve(problem, detached, start), options, "SCIP")

    def _solve(self, problem: MilpProblem, options: SolveOptions, start: np.ndarray | None) -> MilpSolution:
        import pyscipopt

        model = pyscipopt.Model()
        model.hideOutput(quiet=not options.verbose)
        with tempfile.TemporaryDirectory() as folder:
            path = os.path.join(folder, "checkmate.mps")
            write_mps(problem, path)
            model.readProblem(path)
        _apply_options(model, options)
        columns = _columns_in_order(model, problem.num_variables)
        if start is not None:
            _add_start(model, columns, start)
        hooks = _Hooks(options.on_progress, options.should_stop)
        if hooks.active:
            model.includeEventhdlr(_event_handler(pyscipopt, hooks), "checkmate_progress", "progress and stop hooks")
            if options.should_stop is not None:
                model.setParam("misc/catchctrlc", False)
        started = time.perf_counter()
        with _watchdog(model, options.should_stop):
            model.optimizeNogil()  # lets other threads run meanwhile (the watchdog, the portfolio backend)
        elapsed = time.perf_counter() - started
        hooks.raise_if_failed()
        return _read_result(model, columns, elapsed)


# How often the watchdog polls should_stop (seconds).
WATCHDOG_INTERVAL = 0.2


@contextlib.contextmanager
def _watchdog(model: Any, should_stop: Callable[[], bool] | None) -> Iterator[None]:
    """While SCIP runs (GIL released), a thread polls should_stop and interrupts it: events alone can be tens of
    seconds apart while SCIP presolves, runs heuristics or solves one LP."""
    if should_stop is None:
        yield
        return
    finished = threading.Event()

    def watch() -> None:
        while not finished.wait(WATCHDOG_INTERVAL):
            try:
                stop = should_stop()
            except BaseException:  # the event handler reports hook errors; the watchdog only stops
                stop = True
            if stop:
                model.interruptSolve()
                return

    thread = threading.Thread(target=watch, daemon=True)
    thread.start()
    try:
        yield
    finally:
        finished.set()
        thread.join()


def _finite(value: float) -> float | None:
    value = float(value)
    return value if np.isfinite(value) and abs(value) < 1e20 else None  # SCIP's infinity is 1e20


class _Hooks(SolverHooks):
    """The hooks called from SCIP's events; a hook's exception interrupts the solve."""

    def on_event(self, model: Any, new_incumbent: bool) -> None:
        if not self.stop:
            try:
                self.report(_finite(model.getPrimalbound()), _finite(model.getDualbound()), new_incumbent=new_incumbent)
                self.poll_stop("SCIP")
            except BaseException as error:  # re-raised after optimize(); SCIP cannot carry it
                self.fail(error)
        if self.stop:
            model.interruptSolve()


def _event_handler(pyscipopt: Any, hooks: _Hooks) -> Any:
    """An Eventhdlr (pyscipopt is imported only here) passing SCIP's solve events to `hooks`."""
    events = pyscipopt.SCIP_EVENTTYPE
    caught = events.BESTSOLFOUND | events.NODESOLVED | events.LPSOLVED

    class ProgressEvents(pyscipopt.Eventhdlr):
        def eventinitsol(self) -> None:
            self.model.catchEvent(caught, self)

        def eventexitsol(self) -> None:
            self.model.dropEvent(caught, self)

        def eventexec(self, event: Any) -> None:
            hooks.on_event(self.model, event.getType() == events.BESTSOLFOUND)

    return ProgressEvents()


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
