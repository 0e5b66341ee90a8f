"""`time_limit` is the wall time of the whole call, the error's smallest-budget search included (issue 19, item 2).

The search behind an InfeasibleBudget message runs in what is left of the caller's time, or reports that it was not
done; before, it took its own 10 s after the caller's limit (`optimal` with `time_limit=1` took 12.6 s on a
181-node graph). The other paths: a budget the full graph may meet but its coarse graph cannot (27.6 s at
`time_limit=5` before), a tight budget that no baseline meets, and a graph of 901 nodes (6.45 s at `time_limit=3`
before: every baseline ran before the first look at the clock, the MILP got at least 1 s, and HiGHS and SCIP load a
coarse MILP without looking at theirs). Wall-time bounds are 1.10 x the limit + 0.5 s, as the issue states them.
They hold on an otherwise idle machine (beside another test process, HiGHS overran them by up to 1.8 s), hence the
`serial` mark.
"""

from __future__ import annotations

import time

import pytest

import checkmate
from checkmate.bounds import activation_floor
from checkmate.coarsen import choose_partition, coarsen
from checkmate.examples import random_training_graph
from checkmate.graph import Graph
from checkmate.strategies.feasibility import infeasible_budget
from checkmate.strategies.policy import POLICY
from checkmate.strategies.warm_start import lowest_peak_baseline

pytestmark = pytest.mark.serial  # wall-clock bounds: another test on the other core would lengthen them

GRAPH = random_training_graph(90, seed=0)  # 181 nodes: the peak-minimising MILP does not finish in seconds
LARGE = random_training_graph(150, seed=3)  # 301 nodes, planned through a coarse graph
HUGE = random_training_graph(450, seed=1)  # 901 nodes


def coarse_infeasible() -> tuple[Graph, int]:
    """A budget above the activation floor of LARGE and below that of its coarse graph."""
    coarse_floor = activation_floor(coarsen(LARGE, choose_partition(LARGE, POLICY.coarse_nodes)).coarse)
    assert activation_floor(LARGE) + 1 < coarse_floor, "the case needs a coarse graph with a higher floor"
    return LARGE, (activation_floor(LARGE) + coarse_floor) // 2


def tight() -> tuple[Graph, int]:
    """A budget between the activation floor of LARGE and the lowest peak any baseline reaches: no start fits."""
    lowest = lowest_peak_baseline(LARGE)
    assert lowest is not None
    return LARGE, (activation_floor(LARGE) + lowest.peak_memory) // 2


def huge() -> tuple[Graph, int]:
    """60 % of the no-recomputation peak of a 901-node graph."""
    return HUGE, int(0.6 * checkmate.solve(HUGE, None, method="checkpoint_all").peak_memory)


@pytest.mark.parametrize("method", ["optimal", "approx"])
@pytest.mark.parametrize("limit", [1.0, 3.0])
@pytest.mark.parametrize("case", [coarse_infeasible, tight, huge])
def test_every_path_returns_within_the_time_limit(case: object, limit: float, method: str) -> None:
    graph, budget = case()  # type: ignore[operator]
    started = time.perf_counter()
    try:
        plan = checkmate.solve(graph, budget, method=method, time_limit=limit)
    except checkmate.InfeasibleBudget as refused:
        assert refused.minimum is None or refused.minimum > budget
    else:
        assert plan.peak_memory <= budget
    elapsed = time.perf_counter() - started
    assert elapsed <= 1.10 * limit + 0.5, f"{method} with time_limit={limit} took {elapsed:.2f} s"


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
