"""Chen's articulation-point baselines on a captured ResNet: its block boundaries are cut vertices of the forward
path, so `chen_sqrtn` and `chen_greedy` hold well below `checkpoint_all` (before, the BatchNorm step counters, which
nothing on the way to the loss reads, hid every cut vertex and both planned `checkpoint_all`)."""

from __future__ import annotations

import pytest

import checkmate
from checkmate import zoo
from checkmate.strategies.segments import articulation_points, forward_path


@pytest.fixture(scope="module")
def graph() -> checkmate.Graph:
    model, loss_fn, batch = zoo.resnet()
    return checkmate.capture(model, loss_fn, batch, cost_model="flops").graph


def test_block_boundaries_are_articulation_points(graph: checkmate.Graph) -> None:
    path = forward_path(graph)
    assert len(path) < sum(not node.backward for node in graph.nodes), "the step counters are off the path"
    points = articulation_points(graph)
    # The stem, the output of each of the eight blocks, and the head.
    assert len(points) >= 10 and set(points) <= set(path)


@pytest.mark.parametrize("method", ["chen_sqrtn", "chen_greedy"])
def test_chen_holds_well_below_checkpoint_all(graph: checkmate.Graph, method: str) -> None:
    reference = checkmate.solve(graph, None, method="checkpoint_all")
    plan = checkmate.solve(graph, None, method=method)
    checkmate.check_plan(graph, plan.R, plan.S)
    assert plan.peak_memory < 0.8 * reference.peak_memory
    assert plan.cost < 1.5 * reference.cost
