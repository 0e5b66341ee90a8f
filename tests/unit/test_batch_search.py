"""The batch-size search of `checkmate.experiments.batch_search` on synthetic graphs whose memory grows with the
batch size, and its check on graphs that need more (as a real step's kernel scratch adds to a fake-tensor graph's).

Oracle: solve every size from 1 up and take the last size before the first that fails (brute force).
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
import math
from collections.abc import Callable

import pytest

from checkmate import Graph, InfeasibleBudget, Node, solve
from checkmate.bounds import activation_floor
from checkmate.examples import random_training_graph
from checkmate.experiments.batch_search import Planned, check_max_batch, search_max_batch
from checkmate.progress import Progress

BASE = random_training_graph(10, seed=4, skip_probability=0.4)
PARAMETERS = 40  # bytes that do not grow with the batch size, as parameters and their gradients


@functools.cache
def scaled(batch_size: int, base: Graph = BASE) -> Graph:
    """`base` at a batch size: activations and compute grow with it, the fixed memory does not."""
    nodes = tuple(
        Node(node.name, node.cost * batch_size, node.memory * batch_size, node.backward, node.inputs)
        for node in base.nodes
    )
    return Graph(nodes, fixed_memory=PARAMETERS)


def fits(graph: Graph, memory: int, method: str, max_extra_forward_passes: float | None) -> bool:
    try:
        plan = solve(graph, memory, method=method)
    except InfeasibleBudget:
        return False
    no_remat = solve(graph, None).cost
    forward = graph.costs[~graph.is_backward].sum()
    return max_extra_forward_passes is None or plan.cost - no_remat <= max_extra_forward_passes * forward + 1e-9


def brute_force(
    memory: int, method: str, max_extra_forward_passes: float | None = None, graph_at: Callable[[int], Graph] = scaled
) -> int:
    """The last size before the first that fails; also checks that no size up to twice that fits (the search's
    premise, over the sizes it may try)."""
    size = 1
    while fits(graph_at(size), memory, method, max_extra_forward_passes):
        size += 1
    assert not any(
        fits(graph_at(larger), memory, method, max_extra_forward_passes) for larger in range(size, 2 * size + 2)
    )
    return size - 1


@pytest.mark.parametrize("method", ["checkpoint_all", "chen_sqrtn", "chen_greedy"])
@pytest.mark.parametrize("memory", [1_000, 2_500, 6_000])
def test_search_finds_the_brute_force_answer(method: str, memory: int) -> None:
    expected = brute_force(memory, method)
    result = search_max_batch(scaled, memory, method=method)
    assert result.batch_size == expected
    assert result.plan.peak_memory <= memory and result.plan.method == method
    assert result.graph_size == BASE.size and not result.reached_limit
    tried = {attempt.batch_size: attempt.fits for attempt in result.attempts}
    assert tried[expected] and not tried[expected + 1], "the answer and the size above it are both tried"
    solves = sum(attempt.solved for attempt in result.attempts)
    assert solves <= 2 * math.ceil(math.log2(expected + 1)) + 1, "doubling, then bisection"


# The cap binds for the greedy methods (chen_greedy_linear holds everything up to batch 26 at 2500 bytes, then
# recomputes 0.13 and from 28 on 0.26 forward passes; chen_greedy 0.66, then 0.79 from 28 on), not for chen_sqrtn.
@pytest.mark.parametrize(
    ("method", "cap"), [("chen_greedy_linear", 0.2), ("chen_greedy", 0.7), ("chen_sqrtn", 1.0), ("checkpoint_all", 0.0)]
)
def test_the_overhead_cap_counts_forward_passes(method: str, cap: float) -> None:
    memory = 2_500
    expected = brute_force(memory, method, max_extra_forward_passes=cap)
    if method.startswith("chen_greedy"):
        assert expected < brute_force(memory, method), "the cap binds"
    result = search_max_batch(scaled, memory, method=method, max_extra_forward_passes=cap)
    assert result.batch_size == expected
    assert result.extra_forward_passes <= cap + 1e-9
    assert result.compute_ratio == pytest.approx(result.plan.cost / solve(scaled(expected), None).cost)


def test_a_start_above_the_answer_steps_down_by_the_memory_it_needed() -> None:
    expected = brute_force(2_500, "chen_greedy")
    start = 4 * expected + 3
    result = search_max_batch(scaled, "2500", method="chen_greedy", start=start)
    assert result.batch_size == expected
    first, second = result.attempts[:2]
    assert (first.batch_size, first.fits) == (start, False)
    assert second.batch_size == start * 2_500 // activation_floor(scaled(start)), "memory proportional to the batch"


def test_tolerance_stops_early_on_a_size_that_fits() -> None:
    expected = brute_force(6_000, "chen_greedy")
    exact = search_max_batch(scaled, 6_000, method="chen_greedy")
    rough = search_max_batch(scaled, 6_000, method="chen_greedy", tolerance=0.25)
    assert rough.batch_size <= expected <= rough.batch_size * 1.25 + 1
    assert len(rough.attempts) < len(exact.attempts)


def test_memory_that_grows_linearly_takes_a_few_solves() -> None:
    """checkpoint_all's peak is linear in the batch size here: two sizes predict where it stops fitting."""

    def single(batch_size: int) -> Graph:
        return Graph((Node("only", 1.0, 3 * batch_size),), fixed_memory=7)

    result = search_max_batch(single, 1_000, method="checkpoint_all")
    assert result.batch_size == (1_000 - 7) // 3 == 331
    tried = [(attempt.batch_size, attempt.fits) for attempt in result.attempts]
    assert tried == [(1, True), (2, True), (332, False), (331, True)]
    assert not result.attempts[2].solved and result.attempts[2].reason.startswith("the activation floor")
    assert len(search_max_batch(scaled, 6_000, method="checkpoint_all").attempts) <= 5


def test_nothing_fits_names_what_batch_size_1_needs() -> None:
    floor = activation_floor(scaled(1))
    with pytest.raises(InfeasibleBudget, match="not even batch size 1") as caught:
        search_max_batch(scaled, floor - 1, method="checkpoint_all")
    assert caught.value.minimum is None  # the floor ruled it out before any method ran
    peak = solve(scaled(1), None).peak_memory
    with pytest.raises(InfeasibleBudget, match="batch size 1 needs") as caught:
        search_max_batch(scaled, peak - 1, method="checkpoint_all")
    assert caught.value.minimum == peak


def test_memory_that_does_not_grow_stops_at_the_limit() -> None:
    result = search_max_batch(lambda batch_size: BASE, 10**6, method="checkpoint_all", limit=100)
    assert result.batch_size == 100 and result.reached_limit
    assert [attempt.batch_size for attempt in result.attempts] == [1, 2, 4, 8, 16, 32, 64, 100]


def test_progress_reports_each_size() -> None:
    seen: list[Progress] = []
    result = search_max_batch(scaled, 2_500, method="chen_greedy", progress=seen.append)
    phases = " ".join(snapshot.phase for snapshot in seen)
    for attempt in result.attempts:
        assert f"chen_greedy batch {attempt.batch_size}:" in phases
    assert all(later.elapsed >= earlier.elapsed for earlier, later in itertools.pairwise(seen))


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"method": "nonsense"}, "unknown method"),
        ({"start": 0}, "start must lie"),
        ({"start": 5, "limit": 4}, "start must lie"),
        ({"max_extra_forward_passes": -1.0}, "must be >= 0"),
        ({"tolerance": -0.1}, "fraction"),
    ],
)
def test_bad_arguments_are_refused(options: dict[str, object], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        search_max_batch(scaled, 1_000, **options)  # type: ignore[arg-type]


@functools.cache
def with_scratch(batch_size: int) -> Graph:
    """`scaled(batch_size)` with scratch in each backward node's workspace, growing with the batch size as a
    convolution's backward does: what the check's graphs count and the search's do not."""
    graph = scaled(batch_size)
    nodes = tuple(
        dataclasses.replace(node, workspace=node.workspace + 3 * batch_size) if node.backward else node
        for node in graph.nodes
    )
    return Graph(nodes, fixed_memory=graph.fixed_memory)


def planned_with_scratch(method: str, memory: int) -> Callable[[int], Planned]:
    def plan_at(batch_size: int) -> Planned:
        return Planned(with_scratch(batch_size), solve(with_scratch(batch_size), memory, method=method))

    return plan_at


@pytest.mark.parametrize("method", ["checkpoint_all", "chen_greedy"])
def test_the_check_steps_down_to_the_largest_size_that_fits_with_scratch(method: str) -> None:
    memory = 2_500
    found = search_max_batch(scaled, memory, method=method)
    expected = brute_force(memory, method, graph_at=with_scratch)
    assert expected < found.batch_size, "the scratch lowers the answer"
    options = {"method": method, "time_limit": 5}
    checked = check_max_batch(found, planned_with_scratch(method, memory), options)
    assert checked.batch_size == expected and checked.compile_options == options
    assert checked.plan.peak_memory <= memory and checked.graph_size == BASE.size
    assert checked.attempts[: len(found.attempts)] == found.attempts and not any(a.checked for a in found.attempts)
    tried = {attempt.batch_size: attempt.fits for attempt in checked.attempts[len(found.attempts) :]}
    assert tried[found.batch_size] is False and tried[expected] and not tried[expected + 1]
    assert len(tried) <= 5, "the step down follows the memory each size needed"
    assert found.compile_options is None, "the search alone is unchecked"


def test_the_check_keeps_an_answer_that_holds() -> None:
    found = search_max_batch(scaled, 2_500, method="chen_greedy")
    checked = check_max_batch(found, planned_with_scratch("chen_greedy", 10**6), {"method": "chen_greedy"})
    assert checked.batch_size == found.batch_size and [a.checked for a in checked.attempts].count(True) == 1


def test_a_check_that_fits_nothing_says_so() -> None:
    found = search_max_batch(scaled, 2_500, method="checkpoint_all")
    with pytest.raises(InfeasibleBudget, match="not even batch size 1"):
        check_max_batch(found, planned_with_scratch("checkpoint_all", 100), {"method": "checkpoint_all"})
