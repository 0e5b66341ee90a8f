"""Checkpoint sets for the Chen et al. baselines: candidate nodes, articulation points, and S from a checkpoint set.

The forward nodes are those with backward=False. The forward *path* is the part of them the paper calls the
forward graph: the values flowing from the batch to the loss, i.e. the forward nodes the loss depends on
(`forward_path`). Forward nodes off the path (saved statistics, step counters, side outputs read only by the
backward pass) are no part of the articulation-point search (`articulation_points`), but they get a segment too
(`checkpoint_s`).

A checkpoint set C (forward nodes) splits the forward order into segments: the forward nodes between two
consecutive checkpoints. The S built here keeps checkpoints from their computation until their last use, keeps
other forward values only as long as the forward pass needs them, and recomputes each segment once, in the first
stage of the backward pass that needs any of its values; the recomputed values are then held until their last use
(paper Appendix B).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable

import numpy as np

from checkmate.graph import Graph

log = logging.getLogger(__name__)


def forward_nodes(graph: Graph) -> list[int]:
    """Indices of the forward nodes (backward=False), in execution order: the linearised candidates (App. B.2)."""
    return [int(i) for i in np.flatnonzero(~graph.is_backward)]


def loss_nodes(graph: Graph) -> list[int]:
    """The forward values the backward pass starts from: the forward inputs of the first backward node (the loss,
    read by the gradient seed), or the last forward node when there is no such input."""
    is_backward = graph.is_backward
    backward = np.flatnonzero(is_backward)
    if len(backward):
        read = [i for i in graph.predecessors[int(backward[0])] if not is_backward[i]]
        if read:
            return read
    forward = forward_nodes(graph)
    return forward[-1:]


def forward_path(graph: Graph) -> list[int]:
    """The forward graph of the paper: the forward nodes that the loss depends on (`loss_nodes` and their forward
    ancestors), in execution order. Nodes the loss does not read, directly or not, are left out."""
    is_backward = graph.is_backward
    on_path: set[int] = set()
    pending = loss_nodes(graph)
    while pending:
        node = pending.pop()
        if node in on_path:
            continue
        on_path.add(node)
        pending.extend(i for i in graph.predecessors[node] if not is_backward[i])
    return sorted(on_path)


def articulation_points(graph: Graph) -> list[int]:
    """The cut vertices of the forward path between the batch and the loss, in execution order (paper App. B.1).

    The graph searched is undirected: the edges between nodes of `forward_path`, a virtual source joined to the
    path's first node (the op that reads the batch) and a virtual sink joined to `loss_nodes`. A node is returned
    when every route from the source to the sink passes through it, so that the values after it depend on the
    values before it only through it: on a chain every node, in a residual network the block boundaries.

    Path nodes without inputs other than the first (weight casts, constants, a second read of the batch) read only
    memory that is always held, so they can be recomputed anywhere: they are left out of the search rather than
    joined to the source (joined, one shared constant would be a route around every block boundary it spans).
    Runs Tarjan's DFS iteratively, O(V + E).
    """
    path = forward_path(graph)
    if not path:
        return []
    source, sink = graph.size, graph.size + 1
    start = path[0]
    vertices = {node for node in path if node == start or graph.predecessors[node]}
    neighbours: dict[int, set[int]] = {node: set() for node in [*sorted(vertices), source, sink]}
    for node in vertices:
        for i in graph.predecessors[node]:
            if i in vertices:
                neighbours[node].add(i)
                neighbours[i].add(node)
    neighbours[source].add(start)
    neighbours[start].add(source)
    for node in loss_nodes(graph):
        if node in vertices:
            neighbours[node].add(sink)
            neighbours[sink].add(node)
    return sorted(_separators(neighbours, source, sink))


def _separators(neighbours: dict[int, set[int]], source: int, sink: int) -> set[int]:
    """The vertices other than `source` and `sink` whose removal disconnects the two (Tarjan's DFS from `source`).

    Such a vertex lies on the DFS tree path from the source to the sink, and no back edge leaves the subtree of
    its child on that path for a vertex above it (low[child] >= discovered[vertex]). Empty when the sink is not
    reachable. Iterative, without recursion.
    """
    discovered: dict[int, int] = {source: 0}
    low: dict[int, int] = {source: 0}
    parent: dict[int, int] = {source: -1}
    stack: list[tuple[int, list[int]]] = [(source, sorted(neighbours[source]))]
    while stack:
        node, pending = stack[-1]
        if pending:
            child = pending.pop()
            if child not in discovered:
                discovered[child] = low[child] = len(discovered)
                parent[child] = node
                stack.append((child, sorted(neighbours[child])))
            elif child != parent[node]:
                low[node] = min(low[node], discovered[child])
            continue
        stack.pop()
        if parent[node] >= 0:
            low[parent[node]] = min(low[parent[node]], low[node])
    separators: set[int] = set()
    if sink not in discovered:
        return separators
    child = sink
    while parent[child] != source:
        vertex = parent[child]
        if low[child] >= discovered[vertex]:
            separators.add(vertex)
        child = vertex
    return separators


def checkpoint_s(graph: Graph, checkpoints: Iterable[int]) -> np.ndarray:
    """S for a fixed checkpoint set (the role of Checkmate's `gen_s_matrix_fixed_checkpoints`).

    Args:
        graph: the training graph.
        checkpoints: forward nodes to keep from their computation until their last use.

    Returns:
        bool[T, T], strictly lower triangular. Backward values and checkpoints are held until their last use;
        forward values of the final segment (after the last checkpoint, whose backward comes first) are kept too;
        any other forward value is held while later forward nodes read it and again, after its segment is
        recomputed in the first backward stage that needs the segment, until its last use. Segments are as in
        `segment_index`: a value off the forward path goes with the op that makes it.
    """
    T = graph.size
    kept = set(checkpoints)
    forward = forward_nodes(graph)
    is_forward = ~graph.is_backward
    S = np.zeros((T, T), dtype=bool)
    segment_of = segment_index(graph, kept)
    final_segment = sum(node in kept for node in forward)
    reopen = _segment_recompute_stage(graph, forward, kept, segment_of)
    for node in range(T):
        users = graph.users[node]
        if not users:
            continue
        if not is_forward[node] or node in kept or segment_of[node] == final_segment:
            S[node + 1 : users[-1] + 1, node] = True
            continue
        forward_users = [user for user in users if is_forward[user]]
        if forward_users:
            S[node + 1 : forward_users[-1] + 1, node] = True
        S[max(reopen[segment_of[node]], node) + 1 : users[-1] + 1, node] = True
    return S


def segment_index(graph: Graph, checkpoints: set[int]) -> dict[int, int]:
    """For each forward node that is not a checkpoint, its segment: 0 before the first checkpoint, 1 after it, ...

    A node of the forward path (`forward_path`) is in the segment where it runs: the number of checkpoints before
    it in execution order. A node off the path (a side output such as saved statistics, read only by the backward
    pass) is in the segment of the op that makes it: the latest segment among its forward inputs, where the input
    of a checkpoint counts as the segment that follows the checkpoint; one without forward inputs runs where it
    stands. So it is dropped after the forward pass and recomputed with the rest of its segment, from the same
    values, instead of being kept (when it runs after the last checkpoint) or forcing its producer's segment to be
    recomputed a second time (when it runs after the next checkpoint). Any choice gives a valid plan, since R is
    derived from S; this one keeps the segments of the paper.
    """
    on_path = set(forward_path(graph))
    is_forward = ~graph.is_backward
    segment_of: dict[int, int] = {}
    after: dict[int, int] = {}  # the segment a reader of each forward node joins
    passed = 0
    for node in forward_nodes(graph):
        if node in checkpoints:
            passed += 1
            after[node] = passed
            continue
        inputs = [after[i] for i in graph.predecessors[node] if is_forward[i]]
        segment_of[node] = after[node] = passed if node in on_path or not inputs else max(inputs)
    return segment_of


def _segment_recompute_stage(
    graph: Graph, forward: list[int], checkpoints: set[int], segment_of: dict[int, int]
) -> dict[int, int]:
    """For each segment, the first stage in which a backward node reads one of its values."""
    is_backward = graph.is_backward
    first_use: dict[int, int] = {}
    for node in forward:
        if node in checkpoints:
            continue
        backward_users = [user for user in graph.users[node] if is_backward[user]]
        stage = backward_users[0] if backward_users else graph.size
        segment = segment_of[node]
        first_use[segment] = min(first_use.get(segment, graph.size), stage)
    return first_use


def every_kth(candidates: list[int], k: int) -> list[int]:
    """The k-th, 2k-th, ... candidates (Chen's √n rule with k = int(√|candidates|)); none when k < 1."""
    if k < 1:
        return []
    return candidates[k - 1 :: k]


def greedy_checkpoints(graph: Graph, candidates: list[int], segment_budget: float) -> list[int]:
    """Chen's greedy rule: walk the forward order adding up output bytes; at a candidate whose running total
    exceeds `segment_budget`, checkpoint it and restart the total."""
    memory = graph.memory
    allowed = set(candidates)
    chosen: list[int] = []
    running = 0
    for node in forward_nodes(graph):
        running += int(memory[node])
        if node in allowed and running > segment_budget:
            chosen.append(node)
            running = 0
    return chosen
