"""Map a plan of the coarse graph back to the full graph.

Coarse stage b becomes the full stages of block b's members, start_b ... stop_b - 1:
* into its first stage start_b, hold the exported members of every block the coarse plan holds into stage b
  (those a later node can still use);
* into each later stage t of the block, hold what the coarse stage has at hand (the members of the blocks it holds
  or computes, and block b's own members before t) when a member of block b at t or later reads it, or when it is
  held into the next coarse stage.
R is then the cheapest for those checkpoints (`cheapest_r`), and held values that the stage does not read are
dropped (`prune_checkpoints`; the coarse plan frees a block after its last reader in the stage): the
recomputations of coarse stage b happen in full stage start_b, in index order as in the coarse stage, and only the
members that are needed are recomputed. The expanded plan therefore costs no more than the coarse plan, and (the
coarse memory being conservative, see `coarse_graph`) peaks no higher; `expand_plan` simulates it all the same.

Fetched values (`checkmate.fetched`): a value present in coarse stage b is present in every full stage of block b, up
to its end, joined with FSDP2's presence for the expanded R so that every read is covered (`expand_presence`); where
that breaks a rule (a value released before its backward), the expanded plan takes FSDP2's presence.
"""

from __future__ import annotations

import numpy as np

from checkmate.coarsen.coarse_graph import Coarsening
from checkmate.errors import InvalidSchedule
from checkmate.fetched import default_presence, ends, read_stages
from checkmate.graph import Graph
from checkmate.plan import Plan, cheapest_r, make_plan, prune_checkpoints


def latest_descendant(graph: Graph) -> np.ndarray:
    """int64[n]: the latest node that depends on each node (-1 for a node nothing reads)."""
    reach = np.full(graph.size, -1, dtype=np.int64)
    for node in range(graph.size - 1, -1, -1):
        for user in graph.users[node]:
            reach[node] = max(reach[node], user, reach[user])
    return reach


def expand_checkpoints(coarsening: Coarsening, coarse_R: np.ndarray, coarse_S: np.ndarray) -> np.ndarray:
    """The full graph's S (bool[n, n]) for the coarse plan (coarse_R, coarse_S) (see the module doc)."""
    graph, partition = coarsening.graph, coarsening.partition
    n = graph.size
    block_of = partition.block_of
    nodes = np.arange(n)
    useful = latest_descendant(graph)
    coarse_R = coarse_R.astype(bool)
    coarse_S = coarse_S.astype(bool)
    edges = graph.edges
    S = np.zeros((n, n), dtype=bool)
    for block in range(partition.num_blocks):
        start, stop = partition.starts[block], int(partition.stops[block])
        held = coarse_S[block][block_of] & coarsening.exported
        S[start] = held & (nodes < start) & (useful >= start)
        if stop - start == 1:
            continue
        held_next = (
            coarse_S[block + 1][block_of] & coarsening.exported & (useful >= stop)
            if block + 1 < partition.num_blocks
            else np.zeros(n, dtype=bool)
        )
        at_hand = ((coarse_R[block] | coarse_S[block])[block_of] & (block_of < block)) | (block_of == block)
        last_read = np.full(n, -1, dtype=np.int64)
        inside = (edges[:, 1] >= start) & (edges[:, 1] < stop)
        np.maximum.at(last_read, edges[inside, 0], edges[inside, 1])
        stages = np.arange(start + 1, stop)[:, None]
        S[start + 1 : stop] = (
            at_hand[None, :]
            & (nodes[None, :] < stages)
            & (useful[None, :] >= stages)
            & ((last_read[None, :] >= stages) | held_next[None, :])
        )
    return S


def expand_plan(coarsening: Coarsening, coarse_plan: Plan, *, method: str) -> Plan:
    """The coarse plan on the full graph: expanded checkpoints, the cheapest R for them, the fetched values'
    presence (module doc), simulated."""
    graph = coarsening.graph
    S = expand_checkpoints(coarsening, coarse_plan.R, coarse_plan.S)
    R, S = prune_checkpoints(graph, cheapest_r(graph, S), S)
    presence = expand_presence(coarsening, coarse_plan.presence, R) if graph.fetched else None
    try:
        return make_plan(graph, R, S, method=method, presence=presence)
    except InvalidSchedule:
        return make_plan(graph, R, S, method=method)


def expand_presence(coarsening: Coarsening, coarse_presence: np.ndarray, R: np.ndarray) -> np.ndarray:
    """bool[T, F]: each fetched value present in the full stages of the blocks where the coarse plan has it, up to
    its end, and wherever FSDP2's rule for the full plan's runs R has it."""
    graph = coarsening.graph
    presence = coarse_presence[coarsening.partition.block_of].astype(bool)
    for column, end in enumerate(ends(graph.fetched, read_stages(graph.fetched, R))):
        presence[end + 1 :, column] = False
    return presence | default_presence(graph.fetched, R)
