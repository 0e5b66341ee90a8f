"""The activation floor: a budget below which no schedule exists, known without a solve."""

from __future__ import annotations

from checkmate.graph import Graph


def activation_floor(graph: Graph) -> int:
    """The largest first run of a node with its inputs and workspace, beside the fixed memory and what the nodes up to
    it retain: no schedule peaks lower (instant)."""
    working_sets = [
        graph.held_before_stage[k]
        + graph.retained[k]
        + graph.memory[k]
        + graph.workspace[k]
        + sum(graph.memory[i] for i in graph.predecessors[k])
        for k in range(graph.size)
    ]
    return int(max(working_sets, default=graph.fixed_memory))
