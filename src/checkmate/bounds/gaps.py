"""The gaps between a node's uses, the rows built over them, and the bytes every plan has live at a stage: the
shared vocabulary of the retention and closure bounds.

A node i with distinct users u_1 < ... < u_m has the gaps (i, u_1], (u_1, u_2], ..., (u_{m-1}, u_m]: stage ranges
that are disjoint and exclude stage i. Rows are COO triplets of `sum coefficient * column >= lower`.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from checkmate.graph import Graph
from checkmate.milp.formulation import expand_ranges


@dataclass(frozen=True)
class Gaps:
    """Gaps (a, b]: node[g] is unused from stage a[g] + 1 to b[g] - 1 and read again in stage b[g]."""

    node: np.ndarray
    a: np.ndarray
    b: np.ndarray


@dataclass(frozen=True)
class Rows:
    """Rows sum coefficient * column >= lower (COO triplets; `rows` numbers them from 0)."""

    rows: np.ndarray
    cols: np.ndarray
    values: np.ndarray
    lower: np.ndarray


def gaps_of_every_node(graph: Graph) -> Gaps:
    """One gap per edge (i, u): from the previous user of i (or i itself) to u."""
    edges = graph.edges
    order = np.lexsort((edges[:, 1], edges[:, 0]))
    source, user = edges[order, 0], edges[order, 1]
    same_source = np.zeros(source.size, dtype=bool)
    same_source[1:] = source[1:] == source[:-1]
    previous_user = np.concatenate([[0], user[:-1]]).astype(np.int64)
    start = np.where(same_source, previous_user, source)
    return Gaps(node=source, a=start, b=user)


def memory_gaps(graph: Graph) -> Gaps:
    """The gaps of nodes with nonzero memory: keeping a node of zero bytes never costs memory, so the retention MILP
    keeps those gaps and leaves them out."""
    every = gaps_of_every_node(graph)
    keep = graph.memory[every.node] > 0
    return Gaps(node=every.node[keep], a=every.a[keep], b=every.b[keep])


def last_use(graph: Graph) -> np.ndarray:
    """int64[T]: the last stage that reads each node (the node's own stage when nothing reads it)."""
    last = np.arange(graph.size, dtype=np.int64)
    np.maximum.at(last, graph.edges[:, 0], graph.edges[:, 1])
    return last


def inputs_bytes(graph: Graph) -> np.ndarray:
    """int64[T]: the bytes of each node's distinct inputs."""
    total = np.zeros(graph.size, dtype=np.int64)
    np.add.at(total, graph.edges[:, 1], graph.memory[graph.edges[:, 0]])
    return total


def working_set(graph: Graph) -> np.ndarray:
    """int64[T]: the bytes live when node t runs in its own stage, whatever the plan, beside the fixed memory: its
    output and first-run workspace, each distinct input, and what nodes 0..t retain (`Graph.retained_through`)."""
    return graph.memory + graph.workspace + inputs_bytes(graph) + graph.retained_through


def spanning_bytes(graph: Graph, gaps: Gaps) -> np.ndarray:
    """int64[T]: at each stage t, the bytes of the gaps (a, b] with a < t < b: what is live all through stage t
    unless it is recomputed in its gap."""
    gap, stage = expand_ranges(gaps.a + 1, gaps.b)
    return np.bincount(stage, weights=graph.memory[gaps.node[gap]], minlength=graph.size).astype(np.int64)
