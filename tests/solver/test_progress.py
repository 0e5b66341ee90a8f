"""Progress reports and stop requests during a solve (SolveOptions.on_progress / should_stop), and the CLI's line."""

from __future__ import annotations

import io
import math
import signal
import time
from dataclasses import dataclass
from functools import cache

import numpy as np
import pytest

from checkmate.cli.progress_display import ProgressDisplay, format_progress
from checkmate.examples import linear_graph
from checkmate.milp.backends import available_backends, get_backend
from checkmate.milp.formulation import VariableIndex, decode, encode
from checkmate.milp.problem import MilpProblem, SolveOptions, SolveStatus
from checkmate.milp.scaling import memory_scale
from checkmate.progress import Progress, SearchControl, stop_on_interrupt
from checkmate.simulate import simulate

BACKENDS = [name for name in ("highs", "scip") if name in available_backends()]
GRAPH = linear_graph(20)  # 41 nodes
BUDGET = 6  # tight: HiGHS needs well over 10 s to prove it, and finds incumbents within the first second


@cache
def chain_milp() -> tuple[MilpProblem, VariableIndex]:
    scale = memory_scale(GRAPH)
    return encode(GRAPH, scale.budget_units(BUDGET, GRAPH.fixed_memory), scale)


def check_plan(x: np.ndarray | None, objective: float | None) -> None:
    assert x is not None and objective is not None
    cost, peak = simulate(GRAPH, *decode(x, chain_milp()[1]))
    assert peak <= BUDGET
    assert cost == pytest.approx(objective)


@pytest.mark.parametrize("backend", BACKENDS)
def test_progress_reports_the_incumbent_and_bound(backend: str) -> None:
    reports: list[tuple[float | None, float | None]] = []
    problem, _ = chain_milp()
    # Stopped by the first incumbent it reports, not by a clock: a 2 s limit left SCIP without one on a loaded box.
    options = SolveOptions(
        time_limit=30.0,
        on_progress=lambda cost, bound: reports.append((cost, bound)),
        should_stop=lambda: any(cost is not None for cost, _ in reports),
    )
    solution = get_backend(backend).solve(problem, options)
    assert solution.status in (SolveStatus.FEASIBLE, SolveStatus.OPTIMAL)
    check_plan(solution.x, solution.objective)
    incumbents = [cost for cost, _ in reports if cost is not None]
    assert incumbents and all(math.isfinite(cost) for cost in incumbents)
    assert solution.objective is not None and solution.objective <= min(incumbents) + 1e-6
    for cost, bound in reports:
        assert cost is None or bound is None or bound <= cost + 1e-6


@pytest.mark.parametrize("backend", BACKENDS)
def test_should_stop_returns_the_incumbent_early(backend: str) -> None:
    incumbents: list[float] = []

    def on_progress(cost: float | None, bound: float | None) -> None:
        if cost is not None:
            incumbents.append(cost)

    problem, _ = chain_milp()
    options = SolveOptions(time_limit=30.0, on_progress=on_progress, should_stop=lambda: bool(incumbents))
    started = time.perf_counter()
    solution = get_backend(backend).solve(problem, options)
    assert time.perf_counter() - started < 10.0
    assert solution.status is SolveStatus.FEASIBLE
    check_plan(solution.x, solution.objective)
    assert solution.objective is not None and solution.objective <= incumbents[0] + 1e-6


@pytest.mark.parametrize("backend", BACKENDS)
def test_an_exception_in_a_hook_propagates_and_stops_the_solve(backend: str) -> None:
    def on_progress(cost: float | None, bound: float | None) -> None:
        raise ValueError("from the callback")

    problem, _ = chain_milp()
    started = time.perf_counter()
    with pytest.raises(ValueError, match="from the callback"):
        get_backend(backend).solve(problem, SolveOptions(time_limit=30.0, on_progress=on_progress))
    assert time.perf_counter() - started < 10.0


@pytest.mark.parametrize("backend", BACKENDS)
def test_ctrl_c_under_stop_on_interrupt_returns_the_incumbent(backend: str) -> None:
    """A SIGINT during the solve reaches Python's handler (SCIP's own is off), which asks the control to stop."""
    control = SearchControl(time_limit=30.0)

    def on_progress(cost: float | None, bound: float | None) -> None:
        if cost is not None and not control.interrupted:
            signal.raise_signal(signal.SIGINT)

    problem, _ = chain_milp()
    options = SolveOptions(time_limit=30.0, on_progress=on_progress, should_stop=lambda: control.stopped)
    with stop_on_interrupt(control):
        solution = get_backend(backend).solve(problem, options)
    assert control.interrupted
    assert control.elapsed < 10.0
    assert solution.status is SolveStatus.FEASIBLE
    check_plan(solution.x, solution.objective)


def test_highs_keyboard_interrupt_in_a_hook_is_raised_after_the_solve() -> None:
    def should_stop() -> bool:
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        get_backend("highs").solve(chain_milp()[0], SolveOptions(time_limit=30.0, should_stop=should_stop))


def test_highs_lp_honours_should_stop() -> None:
    relaxed = chain_milp()[0].relaxed()
    solution = get_backend("highs").solve(relaxed, SolveOptions(should_stop=lambda: True))
    assert solution.status is SolveStatus.NO_SOLUTION
    assert get_backend("highs").solve(relaxed, SolveOptions()).status is SolveStatus.OPTIMAL


class FakeTerminal(io.StringIO):
    def isatty(self) -> bool:
        return True


@dataclass
class FakePlan:
    status: str
    gap: float | None


SNAPSHOT = Progress(elapsed=3.2, phase="MILP", best_cost=120.0, bound=100.0, time_limit=60.0)


def test_format_progress() -> None:
    line = format_progress(SNAPSHOT)
    for part in ("3/60 s", "MILP", "best 120", "bound 100", "gap 16.67%", "Ctrl-C"):
        assert part in line
    assert "best -" in format_progress(Progress(0.5, "LP bound", bound=7.0))


def test_display_shows_a_line_after_the_delay_and_erases_it() -> None:
    stream = FakeTerminal()
    with ProgressDisplay(stream, refresh=None, delay=2.0) as display:
        display(Progress(elapsed=1.0, phase="baselines", best_cost=150.0))
        assert stream.getvalue() == ""
        display(SNAPSHOT)
        shown = stream.getvalue()
        assert "best 120" in shown and "gap 16.67%" in shown and "\r" in shown
    assert len(stream.getvalue()) > len(shown)  # closing erases the line
    display.summarize(FakePlan("feasible", 1 / 6))
    assert "best plan found (gap 16.67% to the bound)" in stream.getvalue()
    before = stream.getvalue()
    display.summarize(FakePlan("optimal", 0.0))
    assert stream.getvalue() == before


def test_display_redraws_the_clock_between_reports() -> None:
    stream = FakeTerminal()
    with ProgressDisplay(stream, refresh=0.02, delay=0.0) as display:
        display(Progress(elapsed=5.0, phase="MILP"))
        deadline = time.perf_counter() + 5.0
        while "6 s" not in stream.getvalue() and time.perf_counter() < deadline:
            time.sleep(0.05)
    assert "6 s" in stream.getvalue()


def test_display_prints_nothing_off_a_terminal() -> None:
    stream = io.StringIO()
    with ProgressDisplay(stream) as display:
        assert not display.enabled
        display(SNAPSHOT)
    display.summarize(FakePlan("feasible", 0.5))
    assert stream.getvalue() == ""
