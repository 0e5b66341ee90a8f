"""Small graphs with their budgets and proven optima: what every lower bound of `checkmate.bounds` is checked on."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator
from typing import TypeVar

import numpy as np
from oracles import with_workspace

import checkmate
from checkmate.bounds import activation_floor
from checkmate.examples import linear_graph, random_training_graph, training_graph
from checkmate.graph import Graph, Node
from checkmate.moved import HostLink

Found = TypeVar("Found")

FRACTIONS = (0.0, 0.15, 0.35, 0.7)  # of the way from the activation floor to the checkpoint_all peak


def random_graph(seed: int) -> Graph:
    """A forward DAG of 3-6 nodes, each reading its predecessor and up to two earlier nodes (multi-input), with
    its backward graph; sizes 0-9 bytes, costs 0-9, some fixed memory; workspaces (first-run and recompute) on
    every other seed."""
    rng = np.random.default_rng(seed)
    size = int(rng.integers(3, 7))
    forward_inputs: list[list[int]] = [[]]
    for node in range(1, size):
        skips = rng.integers(0, node, int(rng.integers(0, 3))).tolist()
        forward_inputs.append(sorted({node - 1, *skips}))
    graph = training_graph(
        forward_inputs,
        costs=rng.integers(0, 10, size).tolist(),
        memory=rng.integers(0, 10, size).tolist(),
        fixed_memory=int(rng.integers(0, 6)),
    )
    return with_workspace(graph, seed=seed, largest=9) if seed % 2 else graph


def saving_graph(seed: int, size: int | None = None) -> Graph:
    """Like `_random_graph`, but each gradient node reads only what its op saves, as ATen's do: the upstream
    gradients and its output alone (as a ReLU) or, as often, a random nonempty part of its output and inputs (a
    matmul keeps its inputs). Inputs that nothing reads after the forward pass are common then: what the input
    cover charges."""
    rng = np.random.default_rng(seed)
    size = int(rng.integers(4, 8)) if size is None else size
    forward_inputs: list[tuple[int, ...]] = [()]
    for node in range(1, size):
        skips = rng.integers(0, node, int(rng.integers(0, 2))).tolist()
        forward_inputs.append(tuple(sorted({node - 1, *skips})))
    costs = rng.integers(1, 10, size)
    memory = rng.integers(1, 10, size)
    nodes = [Node(f"forward_{j}", float(costs[j]), int(memory[j]), False, forward_inputs[j]) for j in range(size)]
    nodes.append(Node("loss", 1.0, 1, True, (size - 1,)))
    gradient_of: dict[int, int] = {}
    for j in reversed(range(size)):
        upstream = [gradient_of[u] for u in range(j + 1, size) if j in forward_inputs[u]]
        candidates = [j, *forward_inputs[j]]
        subset = [node for node in candidates if rng.random() < 0.5] or [candidates[int(rng.integers(len(candidates)))]]
        saved = [j] if rng.random() < 0.5 else subset
        gradient_of[j] = len(nodes)
        inputs = {*upstream, *saved, *([size] if j == size - 1 else [])}
        nodes.append(Node(f"backward_{j}", 2.0 * float(costs[j]), int(memory[j]), True, tuple(sorted(inputs))))
    return Graph(tuple(nodes), fixed_memory=int(rng.integers(0, 6)))


GRAPHS = {
    **{f"random{seed}": random_graph(seed) for seed in range(16)},
    **{f"saving{seed}": saving_graph(seed) for seed in range(12)},
    **{f"skips{seed}": random_training_graph(7, seed=seed) for seed in range(3)},
    "chain8": linear_graph(8),
}


def budgets(graph: Graph) -> list[int]:
    floor = activation_floor(graph)
    peak = checkmate.solve(graph, None).peak_memory
    return sorted({int(floor + fraction * (peak - floor)) for fraction in FRACTIONS})


def proven_optimum(graph: Graph, budget: int) -> float | None:
    """The proven optimum within `budget` (to the MILP's 1e-4 gap), or None when no plan fits."""
    try:
        plan = checkmate.solve(graph, budget, method="optimal", time_limit=30)
    except checkmate.InfeasibleBudget:
        return None
    assert plan.status == "optimal"
    return plan.cost


def against_the_optimum(bound: Callable[[Graph, int], Found]) -> Iterator[tuple[str, Graph, int, Found, float]]:
    """For every graph of GRAPHS and each of its budgets where a plan fits: (name, graph, budget, what `bound`
    found, the proven optimum). Where `bound` says no plan fits, asserts that none does."""
    for name, graph in GRAPHS.items():
        for budget in budgets(graph):
            optimum = proven_optimum(graph, budget)
            try:
                found = bound(graph, budget)
            except checkmate.InfeasibleBudget:
                assert optimum is None, f"{name} at {budget}: a plan fits, yet the bound says none does"
                continue
            if optimum is not None:
                yield name, graph, budget, found, optimum


def moved_chain() -> Graph:
    """The paper's chain of 2 whose first output (4 bytes, costly to recompute) is read again by the last gradient,
    with a loss that takes 5 bytes of workspace: below the peak of holding it, moving it and recomputing it compete."""
    graph = linear_graph(2)
    sizes, costs, workspaces = (4, 1, 1, 1, 1), (3.0, 1.0, 1.0, 1.0, 1.0), (0, 0, 5, 0, 0)
    nodes = tuple(
        dataclasses.replace(node, memory=size, cost=cost, workspace=workspace)
        for node, size, cost, workspace in zip(graph.nodes, sizes, costs, workspaces, strict=True)
    )
    link = HostLink(to_host_per_byte=0.4, to_device_per_byte=0.3, latency=0.1, overlap=0.7)
    return dataclasses.replace(graph, nodes=nodes, host_link=link)
