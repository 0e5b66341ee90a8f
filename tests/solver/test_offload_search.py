"""The joint search's parts (`checkmate.strategies.offload`, `checkmate.strategies.offload_starts`): moving values
until a plan fits, and a joint plan no costlier than recomputing alone or moving alone at the same budget."""

from __future__ import annotations

import contextlib
import dataclasses

import numpy as np
import pytest

from checkmate.errors import InfeasibleBudget
from checkmate.examples import random_training_graph
from checkmate.graph import Graph
from checkmate.moved import HostLink
from checkmate.simulate import check_plan
from checkmate.solve import solve

# a byte costs a tenth of a unit of compute each way: a node's output (1 to 16 bytes) moves in up to 1.6 units beside
# stages that compute 1 to 10 units, so some moves hide and some do not
LINK = HostLink(to_host_per_byte=0.1, to_device_per_byte=0.1, latency=0.05, overlap=0.8)


def _graph(seed: int) -> Graph:
    return dataclasses.replace(random_training_graph(8, seed=seed), host_link=LINK)


@pytest.mark.parametrize("seed", [0, 1, 3])
def test_offload_only_fits_without_recomputing(seed: int) -> None:
    graph = _graph(seed)
    kept = solve(graph, None, method="checkpoint_all")
    assert solve(graph, kept.peak_memory, method="offload_only").cost == kept.cost
    reached = 0
    for fraction in (0.9, 0.8, 0.7, 0.6):
        budget = int(fraction * kept.peak_memory)
        try:
            plan = solve(graph, budget, method="offload_only")
        except InfeasibleBudget:
            continue
        reached += 1
        assert plan.peak_memory <= budget and plan.moves.any
        assert (np.eye(graph.size, dtype=bool) == plan.R).all(), "offload_only never recomputes"
        check_plan(graph, plan.R, plan.S, plan.moves)
    assert reached > 0


@pytest.mark.parametrize("seed", [0, 1, 3])
def test_the_joint_plan_costs_no_more_than_recomputing_or_moving_alone(seed: int) -> None:
    graph = _graph(seed)
    plain = dataclasses.replace(graph, host_link=None)
    peak = solve(graph, None, method="checkpoint_all").peak_memory
    compared = 0
    for fraction in (0.9, 0.75, 0.6):
        budget = int(fraction * peak)
        others = []
        for on, method in ((plain, "optimal"), (graph, "offload_only")):
            with contextlib.suppress(InfeasibleBudget):
                others.append(solve(on, budget, method=method, **({"time_limit": 20} if method == "optimal" else {})))
        if not others:
            continue
        joint = solve(graph, budget, method="optimal", time_limit=30, progress=False)
        assert joint.peak_memory <= budget
        for other in others:
            assert joint.cost <= other.cost + 1e-9, (fraction, other.method)
        compared += 1
    assert compared > 0
