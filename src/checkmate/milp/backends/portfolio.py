"""HiGHS and SCIP at once, one thread each, on the same problem and warm start: the better answer wins.

Neither solver dominates on these MILPs: warm-started HiGHS proves chains and closes U-Net's full MILP to its bound
where SCIP keeps the warm start, while SCIP proves GPT-2 small's coarse MILP where HiGHS does not improve on its warm
start (`benchmarks/investigations/milp_backends.py`, `benchmarks/investigations/large_graph_parts.py`). Both release
the GIL while they solve, so on two cores the portfolio costs the better one little. When one proves optimality or
infeasibility, the other is asked to stop; the answer is the cheaper incumbent with the higher of the two proven
bounds.
"""

from __future__ import annotations

import dataclasses
import threading
import time

import numpy as np

from checkmate.errors import SolverUnavailable
from checkmate.milp.backends.highs import HighsBackend
from checkmate.milp.backends.scip import ScipBackend
from checkmate.milp.problem import MilpProblem, MilpSolution, SolveOptions, SolveStatus
from checkmate.options import SolverName

# How often the calling thread wakes while the solvers run (seconds): Ctrl-C is handled in between.
_POLL = 0.1


class PortfolioBackend:
    """HiGHS and SCIP in parallel (see the module doc)."""

    name: SolverName = "portfolio"

    def __init__(self) -> None:
        self.members = (HighsBackend(), ScipBackend())

    def is_available(self) -> bool:
        return all(member.is_available() for member in self.members)

    def solve(self, problem: MilpProblem, options: SolveOptions, start: np.ndarray | None = None) -> MilpSolution:
        if not self.is_available():
            raise SolverUnavailable("the portfolio needs both highspy and pyscipopt installed")
        decided = threading.Event()
        lock = threading.Lock()

        def report(objective: float | None, bound: float | None) -> None:
            if options.on_progress is not None:
                with lock:
                    options.on_progress(objective, bound)

        def should_stop() -> bool:
            return decided.is_set() or (options.should_stop is not None and options.should_stop())

        member_options = dataclasses.replace(options, on_progress=report, should_stop=should_stop)
        results: list[MilpSolution | BaseException | None] = [None] * len(self.members)

        def run(position: int) -> None:
            try:
                solution = self.members[position].solve(problem, member_options, start)
            except BaseException as error:  # handed to the calling thread
                results[position] = error
                decided.set()
                return
            results[position] = solution
            if solution.status in (SolveStatus.OPTIMAL, SolveStatus.INFEASIBLE):
                decided.set()

        started = time.perf_counter()
        threads = [threading.Thread(target=run, args=(k,), daemon=True) for k in range(len(self.members))]
        for thread in threads:
            thread.start()
        for thread in threads:
            while thread.is_alive():
                thread.join(_POLL)
        for result in results:
            if isinstance(result, BaseException):
                raise result
        return _combine([r for r in results if isinstance(r, MilpSolution)], time.perf_counter() - started)


def _combine(solutions: list[MilpSolution], elapsed: float) -> MilpSolution:
    """The cheaper incumbent, the higher bound, and the strongest status of the members' answers."""
    with_x = [s for s in solutions if s.x is not None and s.objective is not None]
    proven = [s for s in with_x if s.status is SolveStatus.OPTIMAL]
    best = proven[0] if proven else min(with_x, key=lambda s: s.objective or 0.0, default=None)
    bounds = [s.bound for s in solutions if s.bound is not None]
    statuses = {s.status for s in solutions}
    if SolveStatus.INFEASIBLE in statuses:
        status = SolveStatus.INFEASIBLE
    elif proven:
        status = SolveStatus.OPTIMAL
    elif best is not None:
        status = SolveStatus.FEASIBLE
    else:
        status = SolveStatus.NO_SOLUTION
    return MilpSolution(
        status=status,
        x=None if best is None else best.x,
        objective=None if best is None else best.objective,
        bound=max(bounds) if bounds else None,
        solve_time=elapsed,
        backend="portfolio" if best is None else f"portfolio ({best.backend})",
    )
