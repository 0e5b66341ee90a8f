"""The coarse graph of a partition, with memory accounting that never under-counts the full graph.

Block b becomes one node:
* cost: the sum of its members' costs; recompute cost: the sum of their recompute costs (a block recomputed in a
  later coarse stage expands to recomputations of some of its members, in a later full stage);
* memory: the bytes of its *exported* members (those read by a node of another block, or by none: a sink's
  output lives until its stage ends). Holding the block holds all of them; a plan on the full graph holds a subset;
* inputs: the blocks its members read;
* workspace: what the block holds while it runs beyond its inputs and memory. Replaying the members in order,
  the moment member m runs holds the exported members up to m, the internal members still to be read, and m's own
  workspace; the block's workspace is the largest such moment less its memory. The recompute workspace replays
  the members' recompute workspaces;
* retained: the sum of its members' (all of it from the block's run, at or before each member's own run);
* the graph's `stage_held`, when it has one: the largest of its members' stages, each with what its start holds
  (`opening_held`) but the first member's, which is the coarse stage's opening: a member's start is a moment of the
  coarse stage;
* the graph's fetched values, read by the blocks of their readers, last used in the block of their last use, their
  backward from the block of its first stage (a coarse plan's presence is carried to the full graph by
  `checkmate.coarsen.expand.expand_presence`).

So the moment a coarse node runs (its inputs, its memory, its workspace) bounds every moment of its members in
the expanded plan, where inputs are freed after their last member reader and internal values after their last
reader, never later.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import numpy as np

from checkmate.coarsen.partition import Partition
from checkmate.graph import Graph, Node


@dataclass(frozen=True)
class Coarsening:
    """A graph, a partition of it, and the coarse graph of that partition.

    Attributes:
        graph: the full graph.
        partition: its blocks of consecutive nodes.
        coarse: one node per block (see the module doc).
        exported: bool[n], nodes read by a node of another block, or by none.
    """

    graph: Graph
    partition: Partition
    coarse: Graph
    exported: np.ndarray


def coarsen(graph: Graph, partition: Partition) -> Coarsening:
    """Build the coarse graph of `partition` (see the module doc)."""
    if partition.size != graph.size:
        raise ValueError(f"the partition covers {partition.size} nodes; the graph has {graph.size}")
    block_of = partition.block_of
    edges = graph.edges
    exported = np.zeros(graph.size, dtype=bool)
    crossing = block_of[edges[:, 0]] != block_of[edges[:, 1]]
    exported[edges[crossing, 0]] = True
    exported[[node for node, users in enumerate(graph.users) if not users]] = True
    nodes = [_block_node(graph, partition, block, exported) for block in range(partition.num_blocks)]
    blocks = [partition.members(block) for block in range(partition.num_blocks)]
    held = np.array(graph.stage_held or [0] * graph.size, dtype=np.int64)
    opening = graph.held_at_opening
    within = held + opening  # a later member's start is a moment of the coarse stage
    stage_held = (
        tuple(int(max(held[block.start], within[block.start + 1 : block.stop].max(initial=0))) for block in blocks)
        if graph.stage_held or graph.opening_held
        else ()
    )
    opening_held = tuple(int(opening[block.start]) for block in blocks) if graph.opening_held else ()
    fetched = tuple(
        dataclasses.replace(
            value,
            readers=tuple(sorted({int(block_of[reader]) for reader in value.readers})),
            last_use=int(block_of[value.last_use]),
            backward_start=int(block_of[value.backward_start]) if value.backward_start < graph.size else len(blocks),
        )
        for value in graph.fetched
    )
    coarse = Graph(
        tuple(nodes),
        fixed_memory=graph.fixed_memory,
        stage_held=stage_held,
        opening_held=opening_held,
        fetched=fetched,
        fetch_overlap=graph.fetch_overlap,
        prefetch=graph.prefetch,
    )
    return Coarsening(graph, partition, coarse, exported)


def _block_node(graph: Graph, partition: Partition, block: int, exported: np.ndarray) -> Node:
    members = partition.members(block)
    block_of = partition.block_of
    memory = int(graph.memory[members.start : members.stop][exported[members.start : members.stop]].sum())
    inputs = sorted({int(block_of[i]) for k in members for i in graph.predecessors[k] if block_of[i] != block})
    first = graph.nodes[members.start]
    name = first.name if len(members) == 1 else f"{first.name}+{len(members) - 1}"
    workspace = _replay_peak(graph, members, exported, graph.workspace) - memory
    recompute = _replay_peak(graph, members, exported, graph.recompute_workspace) - memory
    cost = float(graph.costs[members.start : members.stop].sum())
    recompute_cost = float(graph.recompute_costs[members.start : members.stop].sum())
    return Node(
        name=name,
        cost=cost,
        memory=memory,
        backward=bool(graph.is_backward[members.start : members.stop].all()),
        inputs=tuple(inputs),
        workspace=max(0, workspace),
        recompute_workspace=max(0, recompute) if recompute != workspace else None,
        retained=int(graph.retained[members.start : members.stop].sum()),
        recompute_cost=recompute_cost if recompute_cost != cost else None,
    )


def _replay_peak(graph: Graph, members: range, exported: np.ndarray, workspace: np.ndarray) -> int:
    """The largest moment of the block's own values while its members run in order (inputs excluded)."""
    last_reader: dict[int, int] = {}
    for k in members:
        for i in graph.predecessors[k]:
            if i in members:
                last_reader[i] = k
    exported_so_far = 0
    internal = 0
    peak = 0
    for k in members:
        size = int(graph.memory[k])
        if exported[k]:
            exported_so_far += size
        else:
            internal += size
        peak = max(peak, exported_so_far + internal + int(workspace[k]))
        for i in graph.predecessors[k]:
            if last_reader.get(i) == k and not exported[i]:
                internal -= int(graph.memory[i])
    return peak
