"""`checkmate.backend` plans as `checkmate.compile` does: its plans in the disk plan cache, `planning_time_limit` over
all of a region's planning, one cache folder for plans and measures."""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

import checkmate
import checkmate.inductor.backend
from checkmate import InfeasibleBudget, plan_cache, zoo
from checkmate.solve import solve
from checkmate.torch_capture import profile

TIME_LIMIT = 30

pytestmark = pytest.mark.usefixtures("fresh_dynamo")


@pytest.fixture(autouse=True)
def cache_folder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A cache folder of this test's own."""
    monkeypatch.setenv("CHECKMATE_CACHE_DIR", str(tmp_path))
    yield tmp_path


def _small() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(16, 32), nn.Tanh(), nn.Linear(32, 32), nn.Tanh(), nn.Linear(32, 4))


def _train_once(planner: checkmate.inductor.backend.CheckmateBackend) -> None:
    torch.manual_seed(1)
    torch.compile(_small(), backend=planner)(torch.randn(256, 16)).square().mean().backward()


def _recorded_solves(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, Any, dict[str, Any]]]:
    """Record (method, budget, options) of every solve the planning path runs from now on."""
    solves: list[tuple[str, Any, dict[str, Any]]] = []

    def recording_solve(graph: Any, budget: Any, *, method: str, **options: Any) -> Any:
        solves.append((method, budget, options))
        return solve(graph, budget, method=method, **options)

    monkeypatch.setattr("checkmate.solving.solve", recording_solve)
    return solves


@pytest.mark.parametrize("budget", [0.9, 0.3], ids=["within_reach", "falling_back"])
def test_a_second_run_plans_each_region_from_the_plan_cache(
    budget: float, cache_folder: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """The first run writes the region's plan (for a fraction the region cannot reach, the plan at the smallest
    budget known to fit); a second `torch.compile` in a fresh Dynamo reads it instead of solving."""
    first = checkmate.backend(budget=budget, time_limit=TIME_LIMIT)
    _train_once(first)
    assert list((cache_folder / "plans").glob("*.json")), "the first run caches its plan"
    torch._dynamo.reset()
    solves = _recorded_solves(monkeypatch)
    second = checkmate.backend(budget=budget, time_limit=TIME_LIMIT)
    with caplog.at_level(logging.INFO, logger="checkmate.plan_cache"):
        _train_once(second)
    (planned,) = first.regions
    (again,) = second.regions
    assert "loaded the cached plan" in caplog.text
    assert not [solve for solve in solves if solve[1] == again.budget], "the region's plan is not solved again"
    assert again.budget == planned.budget
    assert (again.plan.R == planned.plan.R).all() and (again.plan.S == planned.plan.S).all()


def test_without_the_cache_nothing_is_read_or_written(cache_folder: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _train_once(checkmate.backend(budget=0.9, time_limit=TIME_LIMIT, cache=False))
    assert list(cache_folder.rglob("*")) == [], "cache=False writes neither plans nor node measures"
    torch._dynamo.reset()
    _train_once(checkmate.backend(budget=0.9, time_limit=TIME_LIMIT))
    torch._dynamo.reset()
    solves = _recorded_solves(monkeypatch)
    _train_once(checkmate.backend(budget=0.9, time_limit=TIME_LIMIT, cache=False))
    assert [method for method, _, _ in solves] == ["optimal"], "cache=False solves again"


def test_the_planning_time_limit_covers_compiling_and_measuring(monkeypatch: pytest.MonkeyPatch) -> None:
    """Measuring is made to take 1 s longer: the solve gets what is left of the region's 3 s, not its own 30 s."""
    real_measure = checkmate.inductor.backend.faster_kernels

    def slow_measure(*arguments: Any) -> Any:
        time.sleep(1.0)
        return real_measure(*arguments)

    monkeypatch.setattr(checkmate.inductor.backend, "faster_kernels", slow_measure)
    solves = _recorded_solves(monkeypatch)
    planner = checkmate.backend(budget=0.9, time_limit=TIME_LIMIT, planning_time_limit=3.0)
    _train_once(planner)
    timed = [options for method, _, options in solves if method == "optimal"]
    assert timed and all(options["time_limit"] <= 2.0 for options in timed), timed
    (region,) = planner.regions
    assert region.plan.peak_memory <= region.budget


def test_no_planning_time_left_gives_a_plan_or_a_typed_error() -> None:
    """With no time left for the search, a budget the region fits without recomputation still plans; one that needs
    a search raises InfeasibleBudget (wrapped by Dynamo), never runs unplanned."""
    whole = checkmate.backend(budget=1.0, planning_time_limit=0.0)
    _train_once(whole)
    (region,) = whole.regions
    assert not region.plan.recomputes and region.plan.peak_memory <= region.budget
    torch._dynamo.reset()
    tight = checkmate.backend(budget=0.9, planning_time_limit=0.0, cache=False)
    try:
        _train_once(tight)
    except torch._dynamo.exc.BackendCompilerFailed as failure:
        assert isinstance(failure.inner_exception, InfeasibleBudget)
    else:
        (region,) = tight.regions
        assert region.plan.peak_memory <= region.budget


def test_plans_and_measures_share_one_cache_folder(cache_folder: Path) -> None:
    """`$CHECKMATE_CACHE_DIR` is the folder of every cache: plans in its `plans/`, profiles and measures in its
    `profiles/`, for the backend and for `checkmate.compile` alike."""
    assert plan_cache.cache_directory() == cache_folder / "plans"
    assert profile.cache_directory() == cache_folder / "profiles"
    _train_once(checkmate.backend(budget=0.9, time_limit=TIME_LIMIT))
    model, loss_fn, batch = zoo.mlp(batch_size=4)
    checkmate.compile(model, loss_fn, batch, budget=1.0, cost_model="profile", time_limit=TIME_LIMIT)
    assert {path.name for path in cache_folder.iterdir()} == {"plans", "profiles"}
    assert len(list((cache_folder / "plans").glob("*.json"))) >= 2, "the backend's plan and compile's"
    assert list((cache_folder / "profiles").glob("inductor-*.json")), "the backend's node measures"
    assert [path for path in (cache_folder / "profiles").glob("*.json") if not path.name.startswith("inductor-")]
