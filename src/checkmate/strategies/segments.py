"""Checkpoint sets for the Chen et al. baselines: candidate nodes, articulation points, and S from a checkpoint set.

The forward graph is the set of nodes with backward=False. A checkpoint set C (forward nodes) splits the
forward order into segments: the forward nodes between two consecutive checkpoints. The S built here keeps
checkpoints from their computation until their last use, keeps other forward values only as long as the
forward pass needs them, and recomputes each segment once, in the first stage of the backward pass that
needs any of its values; the recomputed values are then held until their last use (paper Appendix B).
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


def articulation_points(graph: Graph) -> list[int]:
    """The cut vertices of the undirected forward graph, in execution order (paper Appendix B.1).

    A virtual source is joined to every forward node without forward inputs and a virtual sink to every
    forward node without forward users, as Checkmate's code does, so that on a chain every node is a cut vertex
    and the articulation-point variants reproduce the linearised ones. Runs Tarjan's DFS iteratively, O(V + E).
    """
    forward = forward_nodes(graph)
    neighbours = _forward_adjacency(graph, forward)
    return sorted(point for point in _cut_vertices(neighbours) if point < graph.size)


def _forward_adjacency(graph: Graph, forward: list[int]) -> dict[int, set[int]]:
    """Undirected forward edges, plus the virtual source (index T) and sink (index T + 1)."""
    is_forward = ~graph.is_backward
    source, sink = graph.size, graph.size + 1
    neighbours: dict[int, set[int]] = {node: set() for node in [*forward, source, sink]}
    for node in forward:
        inputs = [i for i in graph.predecessors[node] if is_forward[i]]
        for i in inputs:
            neighbours[node].add(i)
            neighbours[i].add(node)
        if not inputs:
            neighbours[node].add(source)
            neighbours[source].add(node)
        if not any(is_forward[user] for user in graph.users[node]):
            neighbours[node].add(sink)
            neighbours[sink].add(node)
    return neighbours


def _cut_vertices(neighbours: dict[int, set[int]]) -> set[int]:
    """Tarjan's articulation points of an undirected graph given as adjacency sets, without recursion."""
    discovered: dict[int, int] = {}
    low: dict[int, int] = {}
    cuts: set[int] = set()
    for root in sorted(neighbours):
        if root in discovered:
            continue
        discovered[root] = low[root] = len(discovered)
        root_children = 0
        stack: list[tuple[int, int, list[int]]] = [(root, -1, sorted(neighbours[root]))]
        while stack:
            node, parent, pending = stack[-1]
            if pending:
                child = pending.pop()
                if child not in discovered:
                    discovered[child] = low[child] = len(discovered)
                    root_children += node == root
                    stack.append((child, node, sorted(neighbours[child])))
                elif child != parent:
                    low[node] = min(low[node], discovered[child])
                continue
            stack.pop()
            if parent >= 0:
                low[parent] = min(low[parent], low[node])
                if parent != root and low[node] >= discovered[parent]:
                    cuts.add(parent)
        if root_children > 1:
            cuts.add(root)
    return cuts


def checkpoint_s(graph: Graph, checkpoints: Iterable[int]) -> np.ndarray:
    """S for a fixed checkpoint set (the role of Checkmate's `gen_s_matrix_fixed_checkpoints`).

    Args:
        graph: the training graph.
        checkpoints: forward nodes to keep from their computation until their last use.

    Returns:
        bool[T, T], strictly lower triangular. Backward values and checkpoints are held until their last use;
        forward values after the last checkpoint are kept too (the final segment, whose backward comes first);
        any other forward value is held while later forward nodes read it and again, after its segment is
        recomputed in the first backward stage that needs the segment, until its last use.
    """
    T = graph.size
    kept = set(checkpoints)
    forward = forward_nodes(graph)
    is_forward = ~graph.is_backward
    last_checkpoint = max(kept, default=-1)
    S = np.zeros((T, T), dtype=bool)
    segment_of = _segment_index(forward, kept)
    reopen = _segment_recompute_stage(graph, forward, kept, segment_of)
    for node in range(T):
        users = graph.users[node]
        if not users:
            continue
        if not is_forward[node] or node in kept or node > last_checkpoint:
            S[node + 1 : users[-1] + 1, node] = True
            continue
        forward_users = [user for user in users if is_forward[user]]
        if forward_users:
            S[node + 1 : forward_users[-1] + 1, node] = True
        S[reopen[segment_of[node]] + 1 : users[-1] + 1, node] = True
    return S


def _segment_index(forward: list[int], checkpoints: set[int]) -> dict[int, int]:
    """For each forward node that is not a checkpoint, the number of checkpoints before it (its segment)."""
    segment_of: dict[int, int] = {}
    passed = 0
    for node in forward:
        if node in checkpoints:
            passed += 1
        else:
            segment_of[node] = passed
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
