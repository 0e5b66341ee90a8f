"""The plan cache: what makes a miss, what an unproven plan serves, and entries that must not be used."""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import checkmate
from checkmate.examples import linear_graph, random_training_graph
from checkmate.graph import Graph
from checkmate.plan import Plan
from checkmate.training import plan_cache

GRAPH = linear_graph(6)
BUDGET = 9


@pytest.fixture(autouse=True)
def cache_directory(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    monkeypatch.setenv("CHECKMATE_CACHE_DIR", str(tmp_path))
    yield tmp_path


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


def _plan(method: str = "chen_sqrtn", status: str = "feasible") -> Plan:
    plan = checkmate.solve(GRAPH, BUDGET, method=method)
    return checkmate.make_plan(GRAPH, plan.R, plan.S, method="optimal", status=status)


def test_the_key_changes_with_budget_method_graph_and_options_but_not_with_effort() -> None:
    key = _key(time_limit=10)
    assert key == _key(time_limit=60) == _key(time_limit=10, mip_gap=0.01), "effort is not in the key"
    others = [_key(budget=BUDGET + 1), _key(method="approx"), _key(graph=random_training_graph(3, seed=0))]
    others.append(_key(backend="scip"))
    assert key not in others and len(set(others)) == len(others)


def test_a_proven_plan_serves_any_later_call() -> None:
    proven = Solver(_plan(status="optimal"))
    first = plan_cache.cached_solve(_key(), GRAPH, cost_model="unit", options={"time_limit": 1}, solve=proven)
    again = plan_cache.cached_solve(_key(), GRAPH, cost_model="unit", options={"time_limit": 600}, solve=proven)
    assert proven.calls == 1 and again.cost == first.cost and again.status == "optimal"


def test_an_unproven_plan_serves_only_calls_that_ask_for_no_more_effort(caplog: pytest.LogCaptureFixture) -> None:
    worse = Solver(_plan("chen_sqrtn"))  # found in 5 s, not proven
    plan_cache.cached_solve(_key(), GRAPH, cost_model="unit", options={"time_limit": 5}, solve=worse)
    with caplog.at_level(logging.INFO, logger="checkmate.training.plan_cache"):
        reused = plan_cache.cached_solve(_key(), GRAPH, cost_model="unit", options={"time_limit": 5}, solve=worse)
    assert worse.calls == 1 and reused.status == "feasible"
    assert "not proven optimal" in caplog.text, "reusing an unproven plan is said"
    better = Solver(_plan("checkpoint_all"))
    longer = plan_cache.cached_solve(_key(), GRAPH, cost_model="unit", options={"time_limit": 60}, solve=better)
    assert better.calls == 1, "more time asked for: solved again"
    assert longer.cost == better.plan.cost < worse.plan.cost
    tighter = plan_cache.cached_solve(
        _key(), GRAPH, cost_model="unit", options={"time_limit": 60, "mip_gap": 1e-4}, solve=Solver(worse.plan)
    )
    assert tighter.cost == better.plan.cost, "a new solve that finds worse keeps the cheaper cached plan"
    assert plan_cache.cached_solve(_key(), GRAPH, cost_model="unit", options={}, solve=better).cost == tighter.cost
    assert better.calls == 2, "no time limit asks for more than any limited solve had"


def test_a_corrupt_or_foreign_entry_is_ignored_with_a_warning(
    cache_directory: Path, caplog: pytest.LogCaptureFixture
) -> None:
    key = _key()
    path = cache_directory / f"{key}.json"
    solver = Solver(_plan(status="optimal"))
    for text in ("{not json", json.dumps({"format": "something-else/1"}), json.dumps([1, 2])):
        path.write_text(text)
        with caplog.at_level(logging.WARNING, logger="checkmate.training.plan_cache"):
            assert plan_cache.load_cached(key, GRAPH, cost_model="unit") is None
        assert "ignoring the cached plan" in caplog.text
        caplog.clear()
    other = random_training_graph(3, seed=0)
    plan_cache.write_plan(path, checkmate.solve(other, None, method="checkpoint_all"), other, cost_model="unit")
    with caplog.at_level(logging.WARNING, logger="checkmate.training.plan_cache"):
        plan = plan_cache.cached_solve(key, GRAPH, cost_model="unit", options={}, solve=solver)
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
    with caplog.at_level(logging.WARNING, logger="checkmate.training.plan_cache"):
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
