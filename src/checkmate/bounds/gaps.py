"""The gaps between a node's uses and the rows built over them: the shared vocabulary of the retention MILP.

A node i with distinct users u_1 < ... < u_m has the gaps (i, u_1], (u_1, u_2], ..., (u_{m-1}, u_m]: stage ranges
that are disjoint and exclude stage i. Rows are COO triplets of `sum coefficient * column >= lower`.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from checkmate.graph import Graph


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
