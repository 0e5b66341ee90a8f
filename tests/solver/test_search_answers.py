"""A search always answers with a plan when one is known: at a budget that holds everything, after a stop, within a
second of a stop, and never worse than the approx or baselines it ran; its arguments are checked before any work."""

from __future__ import annotations

import math
import re
import threading
import time

import pytest

import checkmate
from checkmate.byte_sizes import format_bytes
from checkmate.examples import linear_graph, random_training_graph
from checkmate.milp.formulation import encode
from checkmate.milp.problem import MilpProblem
from checkmate.milp.scaling import DEFAULT_RESOLUTION, memory_scale
from checkmate.progress import SearchControl
from checkmate.strategies import milp_search
from checkmate.strategies.policy import POLICY
from checkmate.strategies.warm_start import best_baseline


def _peak(graph: checkmate.Graph) -> int:
    return checkmate.solve(graph, None).peak_memory


@pytest.mark.parametrize("method", ["optimal", "approx"])
def test_a_budget_that_holds_everything_needs_no_time(method: str) -> None:
    graph = random_training_graph(30, seed=1)
    plan = checkmate.solve(graph, 1.0, method=method, time_limit=0.0)
    assert plan.peak_memory <= _peak(graph) and plan.cost == pytest.approx(float(graph.costs.sum()))
    assert plan.status == "optimal"


@pytest.mark.parametrize("method", ["optimal", "approx"])
def test_a_search_whose_time_is_spent_runs_no_baselines_after_it(method: str) -> None:
    graph = random_training_graph(100, seed=0)
    budget = int(0.5 * _peak(graph))
    assert best_baseline(graph, budget) is not None  # one fits, but finding it takes time the caller did not give
    with pytest.raises(checkmate.InfeasibleBudget, match="time limit"):
        checkmate.solve(graph, budget, method=method, time_limit=0.0)


def test_a_stop_before_any_plan_answers_with_a_baseline_that_fits() -> None:
    graph = random_training_graph(100, seed=0)
    budget = int(0.5 * _peak(graph))
    baseline = best_baseline(graph, budget)
    assert baseline is not None and baseline.method != "checkpoint_all"
    control = SearchControl(time_limit=60.0)
    control.request_stop()
    plan = checkmate.solve(graph, budget, method="optimal", control=control)
    assert plan.peak_memory <= budget and plan.cost <= baseline.cost + 1e-9


@pytest.mark.serial
def test_a_stop_returns_the_best_plan_within_a_second_on_a_large_graph() -> None:
    graph = random_training_graph(400, seed=0)
    budget = int(0.5 * _peak(graph))
    control = SearchControl(time_limit=120.0)
    stopped_at: list[float] = []

    def stop() -> None:
        time.sleep(4.0)
        stopped_at.append(time.perf_counter())
        control.request_stop()

    threading.Thread(target=stop, daemon=True).start()
    plan = checkmate.solve(graph, budget, method="optimal", control=control)
    assert stopped_at and time.perf_counter() - stopped_at[0] < 1.0
    assert plan.peak_memory <= budget


def test_on_a_chain_near_exact_nodes_optimal_is_no_worse_than_approx_or_the_baselines_and_approx_answers() -> None:
    graph = linear_graph(79)  # 159 nodes, one below exact_nodes
    budget = int(0.3 * _peak(graph))
    approx = checkmate.solve(graph, budget, method="approx", time_limit=2.0)
    optimal = checkmate.solve(graph, budget, method="optimal", time_limit=4.0)
    baseline = best_baseline(graph, budget)
    assert approx.peak_memory <= budget and optimal.peak_memory <= budget
    assert optimal.cost <= approx.cost + 1e-9
    assert baseline is None or optimal.cost <= baseline.cost + 1e-9


@pytest.mark.parametrize(
    ("options", "named"),
    [
        ({"time_limit": -1.0}, "time_limit"),
        ({"time_limit": math.nan}, "time_limit"),
        ({"mip_gap": -0.5}, "mip_gap"),
        ({"mip_gap": math.nan}, "mip_gap"),
        ({"backend": "cplex"}, "backend"),
    ],
)
def test_bad_search_options_are_refused_before_any_work(options: dict[str, float], named: str) -> None:
    with pytest.raises(checkmate.InvalidArgument, match=named):
        checkmate.solve(linear_graph(4), 0.5, method="optimal", **options)


@pytest.mark.parametrize("budget", [0.0, 1.5, -3, math.nan, "half", True])
def test_budgets_that_are_none_are_refused(budget: object) -> None:
    with pytest.raises(checkmate.InvalidArgument):
        checkmate.solve(linear_graph(4), budget)  # type: ignore[arg-type]


def test_solve_reads_a_fraction_as_compile_does() -> None:
    graph = linear_graph(10)
    assert checkmate.solve(graph, 0.5, method="chen_greedy").peak_memory <= _peak(graph) // 2
    assert checkmate.solve(graph, 0.5, method="chen_greedy").budget == _peak(graph) // 2


def _named_fraction(error: checkmate.InfeasibleBudget) -> float:
    found = re.search(r"\(([0-9.]+) of the peak\)", str(error))
    assert found is not None, str(error)
    return float(found.group(1))


@pytest.mark.parametrize("method", ["chen_sqrtn", "optimal"])
def test_an_infeasible_fraction_is_named_with_its_bytes_and_the_fraction_that_works(method: str) -> None:
    graph = linear_graph(10)
    peak = _peak(graph)
    with pytest.raises(checkmate.InfeasibleBudget) as caught:
        checkmate.solve(graph, 0.1, method=method)
    error = caught.value
    assert error.budget == int(0.1 * peak) and error.minimum is not None and error.minimum > error.budget
    assert f"budget 0.1 of the no-recomputation peak {format_bytes(peak)} ({format_bytes(error.budget)})" in str(error)
    works = _named_fraction(error)
    assert checkmate.solve(graph, works, method=method).peak_memory <= int(works * peak)
    with pytest.raises(checkmate.InfeasibleBudget) as in_bytes:
        checkmate.solve(graph, error.budget, method=method)
    assert "of the no-recomputation peak" not in str(in_bytes.value), "bytes given, bytes named"


def test_time_the_milp_cannot_use_goes_to_the_rounding() -> None:
    """When what the rounding's share leaves is too little to load the MILP, the rounding gets all the time left:
    its plan is then `optimal`'s answer (where no baseline fits, the only one), as `approx` would find it."""
    large = encode_graph(random_training_graph(79, seed=0), 0.3)  # 60k variables: 2 s to load, more than 20 % of 6 s
    small = encode_graph(random_training_graph(10, seed=0), 0.3)
    control = SearchControl(time_limit=6.0)
    assert milp_search._rounding_time(control, large, POLICY) == pytest.approx(6.0, abs=0.2)
    assert milp_search._rounding_time(control, small, POLICY) == pytest.approx(POLICY.rounding_share * 6.0, abs=0.2)
    assert milp_search._rounding_time(SearchControl(), large, POLICY) is None


def encode_graph(graph: checkmate.Graph, fraction: float) -> MilpProblem:
    scale = memory_scale(graph, DEFAULT_RESOLUTION)
    budget = int(fraction * _peak(graph))
    return encode(graph, scale.budget_units(budget, graph.fixed_memory), scale)[0]


def test_a_start_that_meets_its_bound_is_the_answer_without_rounding(monkeypatch: pytest.MonkeyPatch) -> None:
    """A starting plan proven optimal by the starts' own bound is the answer: the LP rounding (seconds on a real
    model) could not find a cheaper one, so it does not run."""
    graph = linear_graph(12)
    budget = int(0.5 * _peak(graph))
    expected = checkmate.solve(graph, budget, method="optimal")
    assert expected.status == "optimal"

    def no_rounding(*arguments: object, **options: object) -> None:
        raise AssertionError("the rounding ran after a start proven optimal")

    monkeypatch.setattr(milp_search, "round_relaxation", no_rounding)
    plan = checkmate.solve(graph, budget, method="optimal")
    assert plan.status == "optimal" and plan.cost == expected.cost
    assert (plan.R == expected.R).all() and (plan.S == expected.S).all()
