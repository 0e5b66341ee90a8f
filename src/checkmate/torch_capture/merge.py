"""Coarsen a planning graph to at most `max_nodes` nodes so the MILP stays tractable.

Only neighbours in execution order are merged, so the merged graph keeps a valid topological order
and each merged node is still a contiguous run of fx ops that can be executed as is. The memory
accounting stays true because the merged graph is rebuilt from the fx graph: a merged node exports
every value that another node reads (what it keeps alive for the backward pass is counted), and a
value read only inside the merged node counts only while the node runs (its workspace).

Merges are chosen greedily: the pair of neighbours with the smallest combined cost, where the cost
is weighted by how natural the merge is (weights `_TIER_WEIGHTS`):

1. a node read by nothing but its successor (an elementwise chain: conv -> batch norm -> relu);
2. a node its successor reads;
3. any two neighbours of the same phase (forward or backward);
4. any two neighbours.

Weighting instead of strict tiers keeps the merged nodes balanced: a backward pass is a chain of
kind 1 from end to end, and strict tiers would fold all of it into one node.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass

from checkmate.errors import CaptureError
from checkmate.graph import Graph

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class _Block:
    """A run of original planning nodes merged into one."""

    ids: frozenset[int]
    first: int
    cost: float
    backward: bool
    reads: frozenset[int]
    read_by: frozenset[int]


def merge_groups(graph: Graph, groups: Sequence[Sequence[str]], max_nodes: int) -> list[list[str]]:
    """Merge neighbouring planning nodes until at most `max_nodes` remain; returns the new fx-name groups."""
    if max_nodes < 1:
        raise CaptureError(f"max_nodes must be at least 1, got {max_nodes}")
    blocks = [
        _Block(
            ids=frozenset({index}),
            first=index,
            cost=node.cost,
            backward=node.backward,
            reads=frozenset(node.inputs),
            read_by=frozenset(graph.users[index]),
        )
        for index, node in enumerate(graph.nodes)
    ]
    while len(blocks) > max_nodes:
        position = min(range(len(blocks) - 1), key=lambda k: _preference(blocks[k], blocks[k + 1]))
        blocks[position : position + 2] = [_join(blocks[position], blocks[position + 1])]
    log.info("merged %d planning nodes into %d", graph.size, len(blocks))
    return [[name for index in sorted(block.ids) for name in groups[index]] for block in blocks]


_TIER_WEIGHTS = (1.0, 2.0, 4.0, 64.0)
_EPSILON = 1e-12


def _preference(left: _Block, right: _Block) -> tuple[float, int]:
    same_phase = left.backward == right.backward
    if same_phase and left.read_by and left.read_by <= right.ids:
        tier = 0
    elif same_phase and left.read_by & right.ids:
        tier = 1
    else:
        tier = 2 if same_phase else 3
    return _TIER_WEIGHTS[tier] * (left.cost + right.cost + _EPSILON), left.first


def _join(left: _Block, right: _Block) -> _Block:
    ids = left.ids | right.ids
    return _Block(
        ids=ids,
        first=left.first,
        cost=left.cost + right.cost,
        backward=left.backward and right.backward,
        reads=(left.reads | right.reads) - ids,
        read_by=(left.read_by | right.read_by) - ids,
    )
