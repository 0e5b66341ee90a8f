"""`checkmate.compile`'s clock: what `time_limit` and `planning_time_limit` cover, and the default stop gap."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest

import checkmate
import checkmate.solving
import checkmate.training.planning
from checkmate import zoo
from checkmate.search_defaults import DEFAULT_GAP, DEFAULT_STALL_TIME


@pytest.fixture(autouse=True)
def plan_cache_directory(tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.setenv("CHECKMATE_CACHE_DIR", str(tmp_path))
    yield


def recorded_solves(monkeypatch: pytest.MonkeyPatch, capture_seconds: float) -> list[dict[str, Any]]:
    """Make capture take `capture_seconds` longer and record the options of every solve."""
    options_seen: list[dict[str, Any]] = []
    real_capture, real_solve = checkmate.training.planning.capture, checkmate.training.planning.solve

    def slow_capture(*args: Any, **kwargs: Any) -> Any:
        time.sleep(capture_seconds)
        return real_capture(*args, **kwargs)

    def recording_solve(graph: Any, budget: Any, *, method: str, **options: Any) -> Any:
        options_seen.append({"method": method, **options})
        return real_solve(graph, budget, method=method, **options)

    monkeypatch.setattr(checkmate.training.planning, "capture", slow_capture)
    monkeypatch.setattr(checkmate.training.planning, "solve", recording_solve)
    monkeypatch.setattr(checkmate.solving, "solve", recording_solve)
    return options_seen


@pytest.mark.serial  # a wall-clock bound: another test on the other core would lengthen it
def test_the_planning_time_limit_covers_capture(monkeypatch: pytest.MonkeyPatch) -> None:
    solves = recorded_solves(monkeypatch, capture_seconds=1.0)
    model, loss_fn, batch = zoo.mlp(batch_size=8)
    started = time.perf_counter()
    step = checkmate.compile(model, loss_fn, batch, budget=0.97, cost_model="unit", planning_time_limit=12.0)
    elapsed = time.perf_counter() - started
    timed = [options for options in solves if options["method"] == "optimal"]
    assert timed and all(options["time_limit"] <= 11.0 for options in timed), timed
    assert elapsed <= 1.10 * 12.0 + 0.5, f"compile took {elapsed:.2f} s"
    assert step.plan.peak_memory <= step.plan.budget


def test_without_a_planning_limit_each_solve_has_its_own(monkeypatch: pytest.MonkeyPatch) -> None:
    solves = recorded_solves(monkeypatch, capture_seconds=0.0)
    model, loss_fn, batch = zoo.mlp(batch_size=8)
    checkmate.compile(model, loss_fn, batch, budget=0.97, cost_model="unit", time_limit=7)
    timed = [options for options in solves if options["method"] == "optimal"]
    assert timed and all(options["time_limit"] == 7 for options in timed)
    assert all(options["mip_gap"] == DEFAULT_GAP for options in timed), "optimal stops within DEFAULT_GAP"
    assert all(options["stall_time"] == DEFAULT_STALL_TIME for options in timed), "and once its gap stalls"


def test_a_negative_planning_limit_is_refused_before_any_work() -> None:
    model, loss_fn, batch = zoo.mlp(batch_size=2)
    with pytest.raises(checkmate.InvalidArgument, match="planning_time_limit"):
        checkmate.compile(model, loss_fn, batch, budget=1.0, planning_time_limit=-1)


@pytest.mark.parametrize("method", ["optimal", "approx"])
def test_a_budget_that_holds_the_whole_step_never_fails_for_lack_of_time(
    monkeypatch: pytest.MonkeyPatch, method: str
) -> None:
    """Capture takes all of the planning time, so the solve gets none: the plan that recomputes nothing fits a
    budget of 1.0 and needs no search."""
    recorded_solves(monkeypatch, capture_seconds=0.3)
    model, loss_fn, batch = zoo.mlp(batch_size=8)
    step = checkmate.compile(
        model, loss_fn, batch, budget=1.0, method=method, cost_model="unit", planning_time_limit=0.2
    )
    assert not step.plan.recomputes and step.plan.peak_memory <= step.plan.budget
    assert step.plan.status == "optimal"
