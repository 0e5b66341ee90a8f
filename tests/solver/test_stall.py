"""When `optimal`'s MILP stops before its time limit: once its plan is proven within `mip_gap` of the best bound
known (the starts' and the LP's included, which the solver does not see), and with `stall_time` once that gap has
stopped closing (`checkmate.strategies.stall`). The solver is a stand-in that only polls `should_stop`, so what
stops it is the search's rule, not the solver's own."""

from __future__ import annotations

import time

import numpy as np
import pytest

import checkmate
from checkmate.examples import random_training_graph
from checkmate.milp.problem import MilpProblem, MilpSolution, SolveOptions, SolveStatus
from checkmate.progress import SearchControl
from checkmate.strategies import milp_search
from checkmate.strategies.stall import STALL_PROGRESS, StallWatch

# At 70 % of its peak this graph's starts and LP rounding leave a gap, so `optimal` runs its MILP.
GRAPH = random_training_graph(8, seed=3)
BUDGET = int(0.7 * checkmate.solve(GRAPH, None).peak_memory)


class Polling:
    """A MILP backend that finds nothing: it reports `objective()` as its incumbent (None: nothing) and polls
    `should_stop` until it says stop or `limit` seconds pass; `ran` is how long it ran."""

    name = "highs"

    def __init__(self, limit: float, objective: object = lambda: None) -> None:
        self.limit = limit
        self.objective = objective
        self.ran = 0.0

    def is_available(self) -> bool:
        return True

    def solve(self, problem: MilpProblem, options: SolveOptions, start: np.ndarray | None = None) -> MilpSolution:
        began = time.perf_counter()
        while time.perf_counter() - began < self.limit:
            if options.on_progress is not None:
                options.on_progress(self.objective(), None)  # type: ignore[operator]
            if options.should_stop is not None and options.should_stop():
                break
            time.sleep(0.01)
        self.ran = time.perf_counter() - began
        return MilpSolution(SolveStatus.NO_SOLUTION, None, None, None, self.ran, "highs")


def _solve_with(backend: Polling, monkeypatch: pytest.MonkeyPatch, **options: object) -> SearchControl:
    monkeypatch.setattr(milp_search, "milp_backend", lambda *_: backend)
    control = SearchControl(time_limit=60.0)
    checkmate.solve(GRAPH, BUDGET, method="optimal", control=control, **options)
    return control


@pytest.mark.parametrize("stall_time", [None, 0.3])
def test_the_milp_stops_once_its_gap_stalls_for_stall_time(
    stall_time: float | None, monkeypatch: pytest.MonkeyPatch
) -> None:
    backend = Polling(limit=1.5)
    control = _solve_with(backend, monkeypatch, mip_gap=0.0, stall_time=stall_time)
    assert control.best_cost is not None and control.bound is not None and control.best_cost > control.bound
    if stall_time is None:
        assert backend.ran >= 1.5, "without stall_time the MILP runs to its limit"
    else:
        assert stall_time <= backend.ran < 1.0, "the gap never closed: stopped after stall_time"


def test_the_milp_stops_once_its_plan_meets_a_bound_the_solver_does_not_see(monkeypatch: pytest.MonkeyPatch) -> None:
    """The solver reports an incumbent at the starts' bound and no bound of its own: the search is done."""
    control_of: list[SearchControl] = []
    backend = Polling(limit=2.0, objective=lambda: control_of[0].bound)
    monkeypatch.setattr(milp_search, "milp_backend", lambda *_: backend)
    control = SearchControl(time_limit=60.0)
    control_of.append(control)
    checkmate.solve(GRAPH, BUDGET, method="optimal", control=control, mip_gap=1e-4)
    assert backend.ran < 0.5


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_the_stall_clock_restarts_only_when_the_gap_closes_by_stall_progress(monkeypatch: pytest.MonkeyPatch) -> None:
    clock = Clock()
    monkeypatch.setattr("checkmate.strategies.stall.time.perf_counter", clock)
    control = SearchControl()
    watch = StallWatch(control, stall_time=10.0)
    assert not watch.stalled(), "no plan yet"
    clock.now = 100.0
    assert not watch.stalled(), "never stalled before a plan is found"
    control.report("MILP", cost=2.0, bound=1.0)
    assert not watch.stalled()
    clock.now = 109.0
    control.report("MILP", cost=2.0 - 0.5 * STALL_PROGRESS)  # the gap closed by half of STALL_PROGRESS: no progress
    assert not watch.stalled()
    clock.now = 110.0
    assert watch.stalled(), "ten seconds since the gap last closed by STALL_PROGRESS"
    control.report("MILP", bound=1.1)  # the bound closes the gap by about 10 %
    assert not watch.stalled()
    clock.now = 119.0
    assert not watch.stalled()
    clock.now = 120.5
    assert watch.stalled()
    assert not StallWatch(control, stall_time=None).stalled()
