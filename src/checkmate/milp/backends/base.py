"""The interface every solver adapter implements."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Protocol

import numpy as np

from checkmate.milp.problem import MilpProblem, MilpSolution, SolveOptions
from checkmate.options import SolverName

log = logging.getLogger(__name__)


class MilpBackend(Protocol):
    """A solver adapter. It sees only the backend-neutral MilpProblem, never a graph.

    `is_available` is cheap, cached, and never takes a licence. `solve` returns infeasibility and time
    limits as a SolveStatus, never as an exception; `start` is an optional feasible point (a warm start).
    """

    name: SolverName

    def is_available(self) -> bool: ...

    def solve(self, problem: MilpProblem, options: SolveOptions, start: np.ndarray | None = None) -> MilpSolution: ...


# Report a solver's bounds at most this often (seconds); a new incumbent is reported at once.
PROGRESS_INTERVAL = 1.0


class SolverHooks:
    """SolveOptions.on_progress and should_stop as an adapter calls them from its solver's callbacks.

    Solvers swallow exceptions raised in callbacks: one raised by a hook is kept, the solve is stopped (`stop`),
    and `raise_if_failed` raises it once the solver has returned.
    """

    def __init__(
        self,
        on_progress: Callable[[float | None, float | None], None] | None,
        should_stop: Callable[[], bool] | None,
    ) -> None:
        self.on_progress = on_progress
        self.should_stop = should_stop
        self.error: BaseException | None = None
        self.stop = False
        self.last_report = -float("inf")

    @property
    def active(self) -> bool:
        return self.on_progress is not None or self.should_stop is not None

    def raise_if_failed(self) -> None:
        if self.error is not None:
            error, self.error = self.error, None
            raise error

    def fail(self, error: BaseException) -> None:
        if self.error is None:
            self.error = error
        self.stop = True

    def report(self, incumbent: float | None, bound: float | None, *, new_incumbent: bool = False) -> None:
        """Pass (incumbent, bound) on: at once for a new incumbent, else at most every PROGRESS_INTERVAL."""
        now = time.perf_counter()
        if self.on_progress is None or not (new_incumbent or now - self.last_report >= PROGRESS_INTERVAL):
            return
        if incumbent is not None or bound is not None:
            self.last_report = now
            self.on_progress(incumbent, bound)

    def poll_stop(self, solver: str) -> None:
        if self.should_stop is not None and self.should_stop():
            log.info("%s: stop requested; returning the incumbent", solver)
            self.stop = True
