"""Coarsen a planning graph to at most `max_nodes` nodes so the MILP stays tractable.

The nodes to merge are chosen by `checkmate.coarsen.choose_partition` (greedy merges of neighbours in execution
order, cheap and natural merges first), so the merged graph keeps a valid topological order and each merged node
is still a contiguous run of fx ops that can be executed as is. The memory accounting stays true because the
merged graph is rebuilt from the fx graph: a merged node exports every value that another node reads (what it
keeps alive for the backward pass is counted), and a value read only inside the merged node counts only while the
node runs (its workspace).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

from checkmate.coarsen import choose_partition
from checkmate.errors import CaptureError
from checkmate.graph import Graph

log = logging.getLogger(__name__)


def merge_groups(graph: Graph, groups: Sequence[Sequence[str]], max_nodes: int) -> list[list[str]]:
    """Merge neighbouring planning nodes until at most `max_nodes` remain; returns the new fx-name groups.

    Args:
        graph: the planning graph, node i made of the fx ops `groups[i]`.
        groups: the fx names of each planning node, in execution order.
        max_nodes: the most planning nodes to keep.
    """
    if max_nodes < 1:
        raise CaptureError(f"max_nodes must be at least 1, got {max_nodes}")
    partition = choose_partition(graph, max_nodes)
    log.info("merged %d planning nodes into %d", graph.size, partition.num_blocks)
    return [
        [name for index in partition.members(block) for name in groups[index]] for block in range(partition.num_blocks)
    ]
