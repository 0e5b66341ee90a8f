"""The plan cache: what makes a miss, what an unproven plan serves, and entries that must not be used."""

from __future__ import annotations

import dataclasses
import json
import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import checkmate
from checkmate import plan_cache
from checkmate.errors import InvalidSchedule
from checkmate.examples import linear_graph, random_training_graph
from checkmate.graph import Graph
from checkmate.plan import Plan

GRAPH = linear_graph(6)
BUDGET = 9


@pytest.fixture(autouse=True)
def cache_directory(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """The plans folder of a cache folder of this test's own."""
    monkeypatch.setenv("CHECKMATE_CACHE_DIR", str(tmp_path))
    plans = tmp_path / "plans"
    plans.mkdir()
    yield plans


def _key(graph: Graph = GRAPH, budget: int = BUDGET, method: str = "optimal", **options: object) -> str:
    return plan_cache.plan_key(graph, budget=budget, method=method, options=options, cost_model="unit", device="cpu")


class Solver:
    """Counts solves and returns the plan given (status set as asked)."""

    def __init__(self, plan: Plan) -> None:
        self.plan = plan
        self.calls = 0

    def __call__(self) -> Plan:
        self.calls += 1
        return self.plan


def _plan(method: str = "chen_sqrtn", status: str = "feasible", seconds: float = 600.0) -> Plan:
    """A plan as `optimal` would return it after searching `seconds` (by default to the end of every time limit the
    tests ask for)."""
    plan = checkmate.solve(GRAPH, BUDGET, method=method)
    return checkmate.make_plan(GRAPH, plan.R, plan.S, method="optimal", status=status, solve_time=seconds)


def test_the_key_changes_with_budget_method_graph_and_options_but_not_with_effort() -> None:
    key = _key(time_limit=10)
    assert key == _key(time_limit=60) == _key(time_limit=10, mip_gap=0.01), "effort is not in the key"
    others = [_key(budget=BUDGET + 1), _key(method="approx"), _key(graph=random_training_graph(3, seed=0))]
    others.append(_key(backend="scip"))
    assert key not in others and len(set(others)) == len(others)


def test_a_proven_plan_serves_any_later_call() -> None:
    proven = Solver(_plan(status="optimal"))
    first = plan_cache.cached_solve(
        _key(), GRAPH, cost_model="unit", budget=BUDGET, options={"time_limit": 1}, solve=proven
    )
    again = plan_cache.cached_solve(
        _key(), GRAPH, cost_model="unit", budget=BUDGET, options={"time_limit": 600}, solve=proven
    )
    assert proven.calls == 1 and again.cost == first.cost and again.status == "optimal"


def test_an_unproven_plan_serves_only_calls_that_ask_for_no_more_effort(caplog: pytest.LogCaptureFixture) -> None:
    worse = Solver(_plan("chen_sqrtn"))  # found in 5 s, not proven
    plan_cache.cached_solve(_key(), GRAPH, cost_model="unit", budget=BUDGET, options={"time_limit": 5}, solve=worse)
    with caplog.at_level(logging.INFO, logger="checkmate.plan_cache"):
        reused = plan_cache.cached_solve(
            _key(), GRAPH, cost_model="unit", budget=BUDGET, options={"time_limit": 5}, solve=worse
        )
    assert worse.calls == 1 and reused.status == "feasible"
    assert "not proven optimal" in caplog.text, "reusing an unproven plan is said"
    better = Solver(_plan("checkpoint_all"))
    longer = plan_cache.cached_solve(
        _key(), GRAPH, cost_model="unit", budget=BUDGET, options={"time_limit": 60}, solve=better
    )
    assert better.calls == 1, "more time asked for: solved again"
    assert longer.cost == better.plan.cost < worse.plan.cost
    tighter = plan_cache.cached_solve(
        _key(),
        GRAPH,
        cost_model="unit",
        budget=BUDGET,
        options={"time_limit": 60, "mip_gap": 1e-4},
        solve=Solver(worse.plan),
    )
    assert tighter.cost == better.plan.cost, "a new solve that finds worse keeps the cheaper cached plan"
    assert (
        plan_cache.cached_solve(_key(), GRAPH, cost_model="unit", budget=BUDGET, options={}, solve=better).cost
        == tighter.cost
    )
    assert better.calls == 2, "no time limit asks for more than any limited solve had"


def test_a_corrupt_or_foreign_entry_is_ignored_with_a_warning(
    cache_directory: Path, caplog: pytest.LogCaptureFixture
) -> None:
    key = _key()
    path = cache_directory / f"{key}.json"
    solver = Solver(_plan(status="optimal"))
    for text in ("{not json", json.dumps({"format": "something-else/1"}), json.dumps([1, 2])):
        path.write_text(text)
        with caplog.at_level(logging.WARNING, logger="checkmate.plan_cache"):
            assert plan_cache.load_cached(key, GRAPH, cost_model="unit") is None
        assert "ignoring the cached plan" in caplog.text
        caplog.clear()
    other = random_training_graph(3, seed=0)
    plan_cache.write_plan(path, checkmate.solve(other, None, method="checkpoint_all"), other, cost_model="unit")
    with caplog.at_level(logging.WARNING, logger="checkmate.plan_cache"):
        plan = plan_cache.cached_solve(key, GRAPH, cost_model="unit", budget=BUDGET, options={}, solve=solver)
    assert "another graph" in caplog.text and solver.calls == 1 and plan.status == "optimal"


def _damaged(document: dict[str, Any], change: str) -> dict[str, Any]:
    plan = dict(document["plan"])
    if change == "no plan":
        return {**document, "plan": None}
    if change == "no R":
        del plan["R"]
    if change == "R of another size":
        plan["R"] = plan["R"][:-1]
    if change == "effort of words":
        return {**document, "effort": {"time_limit": "long"}}
    return {**document, "plan": plan}


@pytest.mark.parametrize("change", ["no plan", "no R", "R of another size", "effort of words"])
def test_a_damaged_entry_for_this_graph_is_ignored_with_a_warning(
    cache_directory: Path, caplog: pytest.LogCaptureFixture, change: str
) -> None:
    key = _key()
    path = cache_directory / f"{key}.json"
    plan_cache.write_plan(path, _plan(status="optimal"), GRAPH, cost_model="unit")
    path.write_text(json.dumps(_damaged(json.loads(path.read_text()), change)))
    with caplog.at_level(logging.WARNING, logger="checkmate.plan_cache"):
        assert plan_cache.load_cached(key, GRAPH, cost_model="unit") is None
    assert "ignoring the cached plan" in caplog.text


def test_a_bug_while_reading_an_entry_is_not_taken_for_a_damaged_file(
    cache_directory: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Only what a damaged or foreign file raises is caught: an error of ours keeps its type."""
    key = _key()
    plan_cache.write_plan(cache_directory / f"{key}.json", _plan(status="optimal"), GRAPH, cost_model="unit")

    def broken(options: object) -> dict[str, float | None]:
        raise KeyError("a bug of ours")

    monkeypatch.setattr(plan_cache, "_effort", broken)
    with pytest.raises(KeyError, match="a bug of ours"):
        plan_cache.load_cached(key, GRAPH, cost_model="unit")


def test_an_interrupted_plan_does_not_serve_a_call_that_asks_for_more_time(caplog: pytest.LogCaptureFixture) -> None:
    """Ctrl-C 3 s into a 120 s solve: the plan had 3 s of search, not 120 s; a later 20 s solve must search again."""
    interrupted = Solver(_plan("chen_sqrtn", seconds=3.0))
    plan_cache.cached_solve(
        _key(), GRAPH, cost_model="unit", budget=BUDGET, options={"time_limit": 120}, solve=interrupted
    )
    better = Solver(_plan("checkpoint_all", seconds=20.0))
    with caplog.at_level(logging.INFO, logger="checkmate.plan_cache"):
        plan = plan_cache.cached_solve(
            _key(), GRAPH, cost_model="unit", budget=BUDGET, options={"time_limit": 20}, solve=better
        )
    assert better.calls == 1 and plan.cost == better.plan.cost < interrupted.plan.cost
    assert "time_limit=3 s" in caplog.text, "the log gives the effort the interrupted plan really had"
    stopped_without_limit = Solver(_plan("chen_sqrtn", seconds=3.0))
    other = _key(budget=BUDGET + 1)
    plan_cache.cached_solve(other, GRAPH, cost_model="unit", budget=BUDGET + 1, options={}, solve=stopped_without_limit)
    plan_cache.cached_solve(other, GRAPH, cost_model="unit", budget=BUDGET + 1, options={}, solve=stopped_without_limit)
    assert stopped_without_limit.calls == 2, (
        "a search stopped early without a time limit does not serve an unlimited one"
    )


def test_a_plan_stopped_early_within_its_gap_serves_the_same_call() -> None:
    """Stopping before the time limit because the gap was reached is the full effort asked for."""
    within_gap = dataclasses.replace(_plan(seconds=2.0), gap=0.005)
    solver = Solver(within_gap)
    options = {"time_limit": 120, "mip_gap": 0.01}
    for _ in range(2):
        plan_cache.cached_solve(_key(), GRAPH, cost_model="unit", budget=BUDGET, options=options, solve=solver)
    assert solver.calls == 1


def test_a_plan_whose_search_stalled_serves_the_same_call_but_not_one_without_a_stall_rule() -> None:
    """Stopping at `stall_time` is the full effort of a call that asked for it; Ctrl-C in that call is not."""
    options = {"time_limit": 120, "mip_gap": 0.01, "stall_time": 20}
    stalled = Solver(_plan(seconds=25.0))
    for _ in range(2):
        plan_cache.cached_solve(_key(), GRAPH, cost_model="unit", budget=BUDGET, options=options, solve=stalled)
    assert stalled.calls == 1
    for asks_more in ({**options, "stall_time": 40}, {**options, "stall_time": None}):
        plan_cache.cached_solve(_key(), GRAPH, cost_model="unit", budget=BUDGET, options=asks_more, solve=stalled)
    assert stalled.calls == 3, "no stall rule, or a longer one, is more effort: solved again"
    interrupted = Solver(_plan(seconds=25.0))
    other = _key(budget=BUDGET + 1)
    for _ in range(2):
        plan_cache.cached_solve(
            other,
            GRAPH,
            cost_model="unit",
            budget=BUDGET + 1,
            options=options,
            solve=interrupted,
            interrupted=lambda: True,
        )
    assert interrupted.calls == 2, "Ctrl-C, not the stall rule, stopped it: it had 25 s, not 120 s"


def test_an_unwritable_cache_is_a_warning_and_the_plan_is_returned(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    (tmp_path / "a file").write_text("not a directory")
    monkeypatch.setenv("CHECKMATE_CACHE_DIR", str(tmp_path / "a file" / "cache"))  # unwritable, even for root
    solver = Solver(_plan(status="optimal"))
    with caplog.at_level(logging.WARNING, logger="checkmate.plan_cache"):
        plan = plan_cache.cached_solve(_key(), GRAPH, cost_model="unit", budget=BUDGET, options={}, solve=solver)
    assert plan.cost == solver.plan.cost and solver.calls == 1
    assert "cannot write the plan cache" in caplog.text and "a file" in caplog.text


def test_a_damaged_entry_is_removed_and_named(cache_directory: Path, caplog: pytest.LogCaptureFixture) -> None:
    path = cache_directory / f"{_key()}.json"
    path.write_text('{"format": "checkmate-plan/1", "graph": "')  # truncated by a crash
    with caplog.at_level(logging.WARNING, logger="checkmate.plan_cache"):
        assert plan_cache.load_cached(_key(), GRAPH, cost_model="unit", budget=BUDGET) is None
    assert str(path) in caplog.text and not path.exists()


def test_a_plan_over_this_budget_under_its_key_is_refused_and_solved_again(
    cache_directory: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """An entry for this graph but over the budget (copied from another budget's key, or written by another
    version) must not run: the step would exceed the memory it was given."""
    budget = 6
    over = dataclasses.replace(checkmate.solve(GRAPH, None, method="checkpoint_all"), status="optimal")
    assert over.peak_memory > budget
    path = cache_directory / f"{_key(budget=budget)}.json"
    plan_cache.write_plan(path, over, GRAPH, cost_model="unit")
    solver = Solver(checkmate.solve(GRAPH, budget, method="optimal"))
    with caplog.at_level(logging.WARNING, logger="checkmate.plan_cache"):
        plan = plan_cache.cached_solve(
            _key(budget=budget), GRAPH, cost_model="unit", budget=budget, options={}, solve=solver
        )
    assert solver.calls == 1 and plan.peak_memory <= budget
    assert "over the budget" in caplog.text and str(path) in caplog.text
    saved = cache_directory / "saved.json"
    plan_cache.write_plan(saved, over, GRAPH, cost_model="unit")
    with pytest.raises(InvalidSchedule, match="over the budget"):
        plan_cache.read_plan(saved, GRAPH, cost_model="unit", budget=budget)
