"""`search_max_batch` with the MILP (`optimal`) against brute force over batch sizes, with and without a cap on the
extra compute (the paper's Figure 6 caps it at one forward pass)."""

from __future__ import annotations

import functools

import pytest
from test_batch_search import brute_force, scaled

from checkmate import Graph, solve
from checkmate.bounds import activation_floor
from checkmate.examples import random_training_graph, training_graph
from checkmate.experiments.batch_search import search_max_batch

SMALL = random_training_graph(6, seed=4, skip_probability=0.4)
# A chain with one large value: optimal reaches the activation floor at every batch size (minimum_budget == floor).
PEAKED = training_graph([[], [0], [1], [2], [3], [4]], memory=[2, 1, 1, 9, 1, 1])
MEMORY = 600  # optimal holds everything up to batch 9, then recomputes 0.11 forward passes, 0.99 at 12; 13 fails


@functools.cache
def small_at(batch_size: int) -> Graph:
    return scaled(batch_size, SMALL)


@pytest.mark.slow
def test_optimal_batch_size_matches_brute_force_with_and_without_a_cap() -> None:
    uncapped = brute_force(MEMORY, "optimal", graph_at=small_at)
    capped = brute_force(MEMORY, "optimal", max_extra_forward_passes=0.5, graph_at=small_at)
    assert capped < uncapped, "the cap binds"
    for cap, expected in ((None, uncapped), (0.5, capped)):
        result = search_max_batch(small_at, MEMORY, method="optimal", max_extra_forward_passes=cap)
        assert result.batch_size == expected
        assert result.plan.peak_memory <= MEMORY and result.extra_forward_passes <= (cap or 1.0)
        assert result.compute_ratio == pytest.approx(result.plan.cost / solve(small_at(expected), None).cost)
    greedy = brute_force(MEMORY, "chen_greedy", graph_at=small_at)
    assert uncapped >= greedy, "optimal plans at least every size a baseline plans"


def test_optimal_at_its_activation_floor_is_found_with_few_solves() -> None:
    """The floor bounds every method; where optimal reaches it, the search finds the floor's limit from graphs
    alone and solves there, instead of bisecting with solves (its plans' peaks say nothing about where it stops)."""

    @functools.cache
    def peaked_at(batch_size: int) -> Graph:
        return scaled(batch_size, PEAKED)

    memory = 3_000
    floor_limit = max(size for size in range(1, 400) if activation_floor(peaked_at(size)) <= memory)
    result = search_max_batch(peaked_at, memory, method="optimal")
    assert result.batch_size == floor_limit
    assert sum(attempt.solved for attempt in result.attempts) <= 5
