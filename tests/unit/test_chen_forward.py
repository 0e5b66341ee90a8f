"""Chen's articulation-point baselines on graphs shaped like captured ones: the forward graph is the path from the
batch to the loss, and values off it (saved statistics, step counters, weight casts read by the backward) do not
hide its cut vertices.

Oracles: the old rule (every forward node without forward inputs joined to a virtual source, every one without
forward users to a virtual sink) by brute force, the paper's equations (`oracles.paper_cost_and_peak`) and the
simulator's plan check.
"""

from __future__ import annotations

import gzip
from pathlib import Path

import numpy as np
import pytest
from oracles import paper_cost_and_peak

from checkmate import Graph, Node, check_plan, simulate, solve
from checkmate.examples import random_training_graph
from checkmate.strategies.chen import chen_greedy, chen_sqrtn
from checkmate.strategies.common import plan_from_s
from checkmate.strategies.segments import (
    articulation_points,
    checkpoint_s,
    forward_path,
    loss_nodes,
    segment_index,
)

RESNET50 = Path(__file__).parents[2] / "benchmarks" / "graphs" / "resnet50.json.gz"


def old_rule_cut_vertices(graph: Graph) -> list[int]:
    """Cut vertices of all forward nodes, with a virtual source and sink joined as the code did before (brute force)."""
    nodes = graph.nodes
    forward = [j for j, node in enumerate(nodes) if not node.backward]
    edges = [(i, j) for j in forward for i in nodes[j].inputs if not nodes[i].backward]
    edges += [("source", j) for j in forward if not any(not nodes[i].backward for i in nodes[j].inputs)]
    edges += [(j, "sink") for j in forward if all(nodes[user].backward for user in graph.users[j])]
    vertices: list[object] = [*forward, "source", "sink"]

    def components(removed: object) -> int:
        parent = {v: v for v in vertices if v != removed}

        def root(v: object) -> object:
            while parent[v] != v:
                v = parent[v]
            return v

        for a, b in edges:
            if removed not in (a, b):
                parent[root(a)] = root(b)
        return len({root(v) for v in parent})

    whole = components(None)
    return [v for v in forward if components(v) > whole]


def residual_graph(*, stats_after_checkpoint: bool = False) -> Graph:
    """Two residual blocks as capture makes them, with the values a captured step has beside the path.

    Forward: stem 0; a weight cast 1 that only the backward reads; block one (2, 4, add 5) with its saved
    statistics 3; block two (6, 8, add 9) with its statistics 7; head 10; loss 11; a step counter 12 that nothing
    reads. With `stats_after_checkpoint`, block one's statistics run after its add (add 4, statistics 5).
    Backward: the gradient seed 13 reads the loss, each gradient reads its op's inputs and output, and the
    statistics and the weight cast are read by the gradients of the ops that made them.
    """
    big, small = 8, 2
    block_one = [("conv_1a", big, (0,)), ("stats_1", small, (2,)), ("conv_1b", big, (2,)), ("add_1", big, (0, 4))]
    if stats_after_checkpoint:
        block_one = [("conv_1a", big, (0,)), ("conv_1b", big, (2,)), ("add_1", big, (0, 3)), ("stats_1", small, (2,))]
    add_1 = 5 if not stats_after_checkpoint else 4
    spec = [
        ("stem", big, ()),
        ("weight_cast", small, ()),
        *block_one,
        ("conv_2a", big, (add_1,)),
        ("stats_2", small, (6,)),
        ("conv_2b", big, (6,)),
        ("add_2", big, (add_1, 8)),
        ("head", 1, (9,)),
        ("loss", 1, (10,)),
        ("counter", 0, ()),
    ]
    names = [name for name, _, _ in spec]
    forward = [Node(name, 1.0, memory, False, inputs) for name, memory, inputs in spec]
    index = {name: i for i, name in enumerate(names)}
    side = {"conv_1a": "stats_1", "conv_2a": "stats_2", "stem": "weight_cast"}
    nodes = [*forward, Node("seed", 1.0, 1, True, (index["loss"],))]
    grad_of: dict[str, int] = {}
    users: dict[str, list[str]] = {name: [] for name in names}
    for name, _, inputs in spec:
        for i in inputs:
            users[names[i]].append(name)
    path_order = ["loss", "head", "add_2", "conv_2b", "conv_2a", "add_1", "conv_1b", "conv_1a", "stem"]
    for name in path_order:
        upstream = [grad_of[user] for user in users[name] if user in grad_of] or [len(forward)]
        reads = {*upstream, index[name], *forward[index[name]].inputs}
        if name in side:
            reads.add(index[side[name]])
        grad_of[name] = len(nodes)
        nodes.append(Node(f"grad_{name}", 2.0, forward[index[name]].memory, True, tuple(sorted(reads))))
    return Graph(tuple(nodes))


def test_side_outputs_hide_every_cut_vertex_from_the_old_rule_but_not_from_the_path() -> None:
    graph = residual_graph()
    assert old_rule_cut_vertices(graph) == []
    assert loss_nodes(graph) == [11]
    assert forward_path(graph) == [0, 2, 4, 5, 6, 8, 9, 10, 11]
    assert articulation_points(graph) == [0, 5, 9, 10, 11]


@pytest.mark.parametrize("method", ["chen_sqrtn", "chen_greedy"])
@pytest.mark.parametrize("stats_after_checkpoint", [False, True])
def test_chen_saves_memory_on_a_graph_with_side_outputs(method: str, stats_after_checkpoint: bool) -> None:
    graph = residual_graph(stats_after_checkpoint=stats_after_checkpoint)
    reference = solve(graph, None, method="checkpoint_all")
    plan = solve(graph, reference.peak_memory - 1, method=method)
    check_plan(graph, plan.R, plan.S)
    assert simulate(graph, plan.R, plan.S) == pytest.approx((plan.cost, plan.peak_memory))
    assert (plan.cost, plan.peak_memory) == pytest.approx(paper_cost_and_peak(graph, plan.R, plan.S))
    assert plan.peak_memory < reference.peak_memory


def test_a_side_output_is_recomputed_with_the_segment_of_the_op_that_makes_it() -> None:
    graph = residual_graph(stats_after_checkpoint=True)
    names = [node.name for node in graph.nodes]
    add_1, add_2 = names.index("add_1"), names.index("add_2")
    stats_1, conv_1a = names.index("stats_1"), names.index("conv_1a")
    assert conv_1a < add_1 < stats_1 < add_2, "the statistics run after the checkpoint that ends their op's segment"
    segments = segment_index(graph, {add_1, add_2})
    assert segments[stats_1] == segments[conv_1a] == 0
    plan = plan_from_s(graph, checkpoint_s(graph, [add_1, add_2]), method="test")
    check_plan(graph, plan.R, plan.S)
    # Block one is recomputed once in the backward pass, with its statistics in the same stage; counted with the
    # segment where they run, the statistics would be recomputed apart and conv_1a (their input) a second time.
    again = [t for t in range(graph.size) if plan.R[t, conv_1a] and t != conv_1a]
    assert len(again) == 1 and plan.R[again[0], stats_1]
    assert plan.R[:, stats_1].sum() == 2
    assert not plan.S[stats_1 + 1 : again[0] + 1, stats_1].any(), "not held through the rest of the forward pass"


def with_side_values(graph: Graph, seed: int) -> tuple[Graph, dict[int, int]]:
    """The graph with values off the path inserted: after some forward nodes, statistics that the node's gradient
    reads; a weight cast at the start that one gradient reads; counters that nothing reads.

    Returns the new graph and where each old node went.
    """
    rng = np.random.default_rng(seed)
    old = graph.nodes
    new: list[Node] = [Node("weight_cast", 1.0, 1)]
    where: dict[int, int] = {}
    stats_of: dict[int, int] = {}
    cast_reader = int(rng.integers(0, sum(not node.backward for node in old)))
    for j, node in enumerate(old):
        inputs = {where[i] for i in node.inputs}
        if node.backward:
            forward_reads = [i for i in node.inputs if not old[i].backward]
            inputs |= {stats_of[i] for i in forward_reads if i in stats_of}
            if cast_reader in forward_reads:
                inputs.add(0)
        where[j] = len(new)
        new.append(Node(node.name, node.cost, node.memory, node.backward, tuple(sorted(inputs))))
        if not node.backward and rng.random() < 0.5:
            stats_of[j] = len(new)
            new.append(Node(f"stats_{j}", 0.5, int(rng.integers(0, 4)), False, (where[j],)))
        if not node.backward and rng.random() < 0.3:
            new.append(Node(f"counter_{j}", 0.1, 0, False, ()))
    return Graph(tuple(new)), where


@pytest.mark.parametrize("seed", range(8))
def test_chen_plans_stay_valid_on_random_graphs_with_side_values(seed: int) -> None:
    base = random_training_graph(8 + 3 * seed, seed=seed, skip_probability=0.4)
    graph, where = with_side_values(base, seed)
    assert articulation_points(graph) == [where[j] for j in articulation_points(base)]
    for target in (base, graph):
        reference = solve(target, None, method="checkpoint_all")
        for strategy in (chen_sqrtn, chen_greedy):
            plan = strategy(target, None)
            check_plan(target, plan.R, plan.S)
            assert (plan.cost, plan.peak_memory) == pytest.approx(paper_cost_and_peak(target, plan.R, plan.S))
            assert plan.peak_memory <= reference.peak_memory


@pytest.mark.parametrize("method", ["chen_sqrtn", "chen_greedy"])
def test_chen_saves_memory_on_a_captured_resnet50(method: str) -> None:
    with gzip.open(RESNET50, "rt") as file:
        graph = Graph.from_json(file.read())
    assert len(articulation_points(graph)) >= 16, "the block boundaries of ResNet-50"
    reference = solve(graph, None, method="checkpoint_all")
    plan = solve(graph, None, method=method)
    check_plan(graph, plan.R, plan.S)
    assert plan.peak_memory < 0.6 * reference.peak_memory
    assert plan.cost < 1.4 * reference.cost
