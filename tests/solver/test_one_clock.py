"""`time_limit` is the wall time of the whole call, the error's smallest-budget search included (issue 19, item 2).

The search behind an InfeasibleBudget message runs in what is left of the caller's time, or reports that it was not
done; before, it took its own 10 s after the caller's limit (`optimal` with `time_limit=1` took 12.6 s on a
181-node graph). Wall-time bounds are 1.10 x the limit + 0.5 s, as the issue states them. They hold on an otherwise
idle machine (beside another test process, HiGHS overran them by up to 1.8 s), hence the `serial` mark.
"""

from __future__ import annotations

import time

import pytest

import checkmate
from checkmate.bounds import activation_floor
from checkmate.examples import random_training_graph
from checkmate.strategies.feasibility import infeasible_budget

pytestmark = pytest.mark.serial  # wall-clock bounds: another test on the other core would lengthen them

GRAPH = random_training_graph(90, seed=0)  # 181 nodes: the peak-minimising MILP does not finish in seconds


@pytest.mark.parametrize("method", ["optimal", "approx"])
@pytest.mark.parametrize("limit", [1.0, 3.0])
def test_an_infeasible_budget_is_reported_within_the_time_limit(method: str, limit: float) -> None:
    budget = activation_floor(GRAPH) - 1
    started = time.perf_counter()
    with pytest.raises(checkmate.InfeasibleBudget) as refused:
        checkmate.solve(GRAPH, budget, method=method, time_limit=limit)
    elapsed = time.perf_counter() - started
    assert elapsed <= 1.10 * limit + 0.5, f"{method} with time_limit={limit} took {elapsed:.2f} s"
    assert refused.value.minimum is None or refused.value.minimum > budget


def test_with_no_time_left_the_message_says_the_minimum_was_not_searched() -> None:
    budget = activation_floor(GRAPH) - 1
    started = time.perf_counter()
    error = infeasible_budget(GRAPH, budget, method="optimal", time_limit=0.0)
    assert time.perf_counter() - started < 2.0
    assert "not searched" in str(error), str(error)
    assert error.minimum is None or error.minimum > budget
