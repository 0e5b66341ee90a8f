"""Ctrl-C and stops: a search answers with its best plan within a second of one, whatever phase it is in (the solver
need not have noticed it yet), a second Ctrl-C raises KeyboardInterrupt, and a solver stopped by its time limit
is still waited for."""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Callable

import numpy as np
import pytest

import checkmate
from checkmate.examples import random_training_graph
from checkmate.milp.backends.detached import GRACE_SECONDS, solve_detached
from checkmate.milp.problem import MilpSolution, SolveOptions, SolveStatus
from checkmate.progress import Progress, SearchControl, interrupt_scope, stop_on_interrupt
from checkmate.simulate import simulate

# The retention MILP of this graph at half its peak: HiGHS presolves and probes it for about 3 s without calling back.
GRAPH = random_training_graph(500, seed=0)


def _half_peak() -> int:
    return int(0.5 * checkmate.solve(GRAPH, None).peak_memory)


def _after_the_baselines(act: threading.Event, delay: float) -> tuple[SearchControl, list[float]]:
    """A control whose callback fires `act` `delay` seconds after the first starting plan (the retention MILP runs
    then); the moments it fired are appended to the list."""
    fired: list[float] = []
    armed = threading.Event()

    def on_progress(snapshot: Progress) -> None:
        if snapshot.phase == "baselines" and not armed.is_set():
            armed.set()
            threading.Timer(delay, lambda: (fired.append(time.perf_counter()), act.set())).start()

    return SearchControl(time_limit=120.0, callback=on_progress), fired


@pytest.mark.serial
def test_a_stop_while_the_retention_milp_presolves_returns_the_best_plan_within_a_second() -> None:
    budget = _half_peak()
    stop = threading.Event()
    control, fired = _after_the_baselines(stop, 0.5)
    threading.Thread(target=lambda: stop.wait() and control.request_stop(), daemon=True).start()
    plan = checkmate.solve(GRAPH, budget, method="optimal", control=control)
    assert fired and time.perf_counter() - fired[0] < 1.0
    cost, peak = simulate(GRAPH, plan.R, plan.S)
    assert peak <= budget and cost == pytest.approx(plan.cost)


@pytest.mark.serial
def test_a_real_sigint_during_a_solve_returns_a_plan_that_fits_within_a_second() -> None:
    budget = _half_peak()
    send = threading.Event()
    progress_control, fired = _after_the_baselines(send, 0.5)

    def sigint() -> None:
        send.wait()
        os.kill(os.getpid(), signal.SIGINT)

    threading.Thread(target=sigint, daemon=True).start()
    plan = checkmate.solve(GRAPH, budget, method="optimal", time_limit=120.0, progress=progress_control.callback)
    assert fired and time.perf_counter() - fired[0] < 1.0
    assert plan.solve_time < 30.0 and plan.status == "feasible"
    cost, peak = simulate(GRAPH, plan.R, plan.S)
    assert peak <= budget and cost == pytest.approx(plan.cost)


def test_a_second_ctrl_c_raises_keyboard_interrupt_and_a_scope_remembers_the_first() -> None:
    with interrupt_scope() as interrupted:
        first = SearchControl()
        with stop_on_interrupt(first):
            signal.raise_signal(signal.SIGINT)
            assert first.interrupted and interrupted.is_set()
            with pytest.raises(KeyboardInterrupt):
                signal.raise_signal(signal.SIGINT)
        later = SearchControl()
        with stop_on_interrupt(later):
            assert later.interrupted  # a later search of the same call starts stopped
    outside = SearchControl()
    with stop_on_interrupt(outside):
        assert not outside.interrupted


def _stubborn(poll: float, seen: list[SolveOptions]) -> Callable[[SolveOptions], MilpSolution]:
    """A solver that looks at its stop flag only every `poll` seconds (as HiGHS while it presolves); the options it
    was given are appended to `seen`."""

    def solve(options: SolveOptions) -> MilpSolution:
        seen.append(options)
        started = time.perf_counter()
        while not (options.should_stop is not None and options.should_stop()):
            time.sleep(poll)
        return MilpSolution(SolveStatus.FEASIBLE, np.zeros(1), 1.0, 0.5, time.perf_counter() - started, "stub")

    return solve


@pytest.mark.serial  # a 0.8 s wall-clock bound on a 0.5 s call: another test on the other core would lengthen it
def test_an_interrupted_solver_is_not_waited_for_and_is_told_to_stop() -> None:
    interrupted = threading.Event()
    seen: list[SolveOptions] = []
    threading.Timer(0.2, interrupted.set).start()
    started = time.perf_counter()
    options = SolveOptions(should_stop=lambda: False, interrupted=interrupted.is_set)
    solution = solve_detached(_stubborn(3.0, seen), options, "stub")
    assert solution.status is SolveStatus.NO_SOLUTION and solution.x is None
    assert time.perf_counter() - started < 0.2 + GRACE_SECONDS + 0.3
    assert seen[0].should_stop is not None and seen[0].should_stop()  # the solver was asked to stop too


def test_a_solver_stopped_by_its_clock_is_waited_for() -> None:
    deadline = time.perf_counter() + 0.2
    options = SolveOptions(should_stop=lambda: time.perf_counter() > deadline, interrupted=lambda: False)
    solution = solve_detached(_stubborn(1.0, []), options, "stub")
    assert solution.status is SolveStatus.FEASIBLE and solution.objective == 1.0
