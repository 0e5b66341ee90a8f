"""Partitions of a graph into blocks of consecutive nodes, and the greedy choice of one.

This is the one merge order of the package: `coarsen` plans large graphs through the blocks it chooses, and
capture's `max_nodes` (`checkmate.torch_capture.merge`) merges the fx ops of each block into one planning node.

Blocks are runs of consecutive nodes in execution order, so the coarse graph keeps a topological order and a
coarse stage maps to consecutive full stages. Merges are chosen greedily: the pair of neighbouring blocks with the
smallest combined recompute cost (`Node.recompute_cost`: a block is recomputed whole), weighted by how natural the
merge is (`TIER_WEIGHTS`) and by the bytes of the merged block (`1 + combined bytes / (all bytes / max_nodes)`); ties
go to the leftmost pair. The tiers:

1. the left block is read by nothing but the right one (an elementwise chain, most of the backward pass);
2. the right block reads the left one;
3. any two neighbours of the same phase (forward or backward);
4. any two neighbours (only once no same-phase merge is left: phases stay apart while they can).

Weighting by cost instead of strict tiers keeps blocks balanced: cheap ops (views, elementwise ops) join their
neighbours first, and expensive ones (convolutions, matrix products) stay apart longest, so the coarse plan can
still choose to keep or recompute each of them. Weighting by size keeps blocks balanced in bytes too: a block is
held or dropped whole, so a large one raises the smallest budget the merged graph can meet.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from functools import cached_property

import numpy as np

from checkmate.errors import InvalidArgument, InvalidGraph
from checkmate.graph import Graph

log = logging.getLogger(__name__)

TIER_WEIGHTS = (1.0, 2.0, 4.0, 1e200)  # the last: merge across phases only when nothing else is left
_EPSILON = 1e-12


@dataclass(frozen=True)
class Partition:
    """Blocks of consecutive nodes: block b holds nodes starts[b] up to (not including) starts[b + 1].

    Attributes:
        starts: the first node of each block, increasing, starting at 0.
        size: the number of nodes partitioned.
    """

    starts: tuple[int, ...]
    size: int

    def __post_init__(self) -> None:
        starts = np.asarray(self.starts)
        if self.size < 1 or starts.size == 0 or starts[0] != 0:
            raise InvalidGraph(f"a partition of {self.size} nodes must start its first block at node 0")
        if np.any(np.diff(starts) <= 0) or starts[-1] >= self.size:
            raise InvalidGraph(f"block starts must increase and stay below {self.size}: {self.starts}")

    @classmethod
    def singletons(cls, size: int) -> Partition:
        """Every node its own block."""
        return cls(tuple(range(size)), size)

    @property
    def num_blocks(self) -> int:
        return len(self.starts)

    @cached_property
    def stops(self) -> np.ndarray:
        """int64[blocks]: one past the last node of each block."""
        return np.append(np.asarray(self.starts[1:], dtype=np.int64), self.size)

    @cached_property
    def block_of(self) -> np.ndarray:
        """int64[size]: the block of each node."""
        return np.repeat(np.arange(self.num_blocks), self.stops - np.asarray(self.starts))

    def members(self, block: int) -> range:
        return range(self.starts[block], int(self.stops[block]))


def choose_partition(graph: Graph, max_nodes: int) -> Partition:
    """Merge neighbouring nodes greedily (see the module doc) until at most `max_nodes` blocks remain (the nodes of
    the coarse graph)."""
    if max_nodes < 1:
        raise InvalidArgument(f"max_nodes must be at least 1, got {max_nodes}")
    starts = list(range(graph.size))
    stops = [index + 1 for index in range(graph.size)]
    costs = [float(cost) for cost in graph.recompute_costs]  # what a merged block costs each time it is recomputed
    sizes = [float(size) for size in graph.memory]
    size_scale = max(float(graph.memory.sum()) / max_nodes, 1.0)
    backward = [bool(flag) for flag in graph.is_backward]
    read_by = [set(users) for users in graph.users]
    scores = np.array([_score(k, stops, costs, sizes, size_scale, backward, read_by) for k in range(graph.size - 1)])
    while len(starts) > max_nodes:
        k = int(np.argmin(scores))
        stops[k] = stops.pop(k + 1)
        costs[k] += costs.pop(k + 1)
        sizes[k] += sizes.pop(k + 1)
        right_backward = backward.pop(k + 1)
        backward[k] = backward[k] and right_backward
        merged = read_by[k] | read_by.pop(k + 1)
        read_by[k] = {user for user in merged if user >= stops[k]}
        starts.pop(k + 1)
        scores = np.delete(scores, k)
        for pair in (k - 1, k):
            if 0 <= pair < len(starts) - 1:
                scores[pair] = _score(pair, stops, costs, sizes, size_scale, backward, read_by)
    log.info("partitioned %d nodes into %d blocks", graph.size, len(starts))
    return Partition(tuple(starts), graph.size)


def _score(
    k: int,
    stops: list[int],
    costs: list[float],
    sizes: list[float],
    size_scale: float,
    backward: list[bool],
    read_by: list[set[int]],
) -> float:
    """How much merging blocks k and k + 1 costs the plan: their combined recompute cost, weighted by the merge's
    tier and by their combined size (a large block is held or dropped whole)."""
    same_phase = backward[k] == backward[k + 1]
    readers = read_by[k]
    right_stop = stops[k + 1]
    if same_phase and readers and max(readers) < right_stop:
        tier = 0
    elif same_phase and readers and min(readers) < right_stop:
        tier = 1
    else:
        tier = 2 if same_phase else 3
    return TIER_WEIGHTS[tier] * (costs[k] + costs[k + 1] + _EPSILON) * (1.0 + (sizes[k] + sizes[k + 1]) / size_scale)
