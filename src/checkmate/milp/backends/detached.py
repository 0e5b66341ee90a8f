"""A solve the caller stops waiting on once it is asked to stop.

Solvers look at their stop flag only from their own callbacks, and these can be seconds apart: HiGHS calls none
while it presolves a MILP or probes it at the root (seconds on a large graph's retention MILP), SCIP none while
it solves one LP. And Python runs a Ctrl-C handler only in the main thread between two bytecodes, never while that
thread is inside a solver. So `solve_detached` runs the solve in a worker thread while the calling thread waits in
short slices:

* Ctrl-C is handled at once (for example by `checkmate.progress.stop_on_interrupt`);
* once `interrupted` returns True (`SolveOptions.interrupted`: Ctrl-C, not a time limit), the solver has
  `GRACE_SECONDS` to return its incumbent; after that the answer is NO_SOLUTION (no incumbent, no bound, which every
  caller already handles as a solve stopped early) and the solver, asked to stop, ends alone at its next callback or
  its time limit. A solver stopped by a time limit is waited for, as it returns its incumbent and bound;
* when waiting ends with an exception (a second Ctrl-C raises KeyboardInterrupt), the solver is asked to stop too.

The worker is not a daemon thread: at exit the interpreter waits for a solve left running rather than finalizing
under it.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
import time
from collections.abc import Callable

from checkmate.milp.problem import MilpSolution, SolveOptions, SolveStatus

log = logging.getLogger(__name__)

# Seconds a solver asked to stop has to return its incumbent before the caller stops waiting for it.
GRACE_SECONDS = 0.3
# How often the waiting thread wakes to poll `should_stop` (and to run Python's signal handlers).
POLL_SECONDS = 0.05


def solve_detached(solve: Callable[[SolveOptions], MilpSolution], options: SolveOptions, solver: str) -> MilpSolution:
    """`solve(options)` run in a worker thread (module doc); `solve` gets `options` whose `should_stop` is also True
    once interrupted or once the caller stopped waiting. `solver` names the solver in the log."""
    abandoned = threading.Event()
    asked, interrupted = options.should_stop, options.interrupted

    def should_stop() -> bool:
        return abandoned.is_set() or (interrupted is not None and interrupted()) or (asked is not None and asked())

    outcome: list[MilpSolution | BaseException] = []

    def run() -> None:
        try:
            outcome.append(solve(dataclasses.replace(options, should_stop=should_stop)))
        except BaseException as error:  # handed to the waiting thread
            outcome.append(error)

    worker = threading.Thread(target=run, name=f"checkmate-{solver}")
    started = time.perf_counter()
    worker.start()
    stop_seen: float | None = None
    try:
        while worker.is_alive():
            worker.join(POLL_SECONDS)
            if stop_seen is None and interrupted is not None and interrupted():
                stop_seen = time.perf_counter()
            if worker.is_alive() and stop_seen is not None and time.perf_counter() - stop_seen >= GRACE_SECONDS:
                abandoned.set()
                log.info("%s did not return within %.1f s of an interrupt: answering without it", solver, GRACE_SECONDS)
                return MilpSolution(SolveStatus.NO_SOLUTION, None, None, None, time.perf_counter() - started, solver)
    except BaseException:
        abandoned.set()
        raise
    result = outcome[0]
    if isinstance(result, BaseException):
        raise result
    return result
