"""Input cover: columns and rows that make the retention bound pay for the inputs a recomputation needs.

The retention MILP (`checkmate.bounds.retention`) charges a recomputation of node i in a gap (a, b] only c'_i: it
never asks where i's inputs come from. An input j whose last use is at or before a is dead by then, and a real plan
must either compute j again or keep it past its last use; nor can it recompute i early and drop it, since i must
then be held until its user b reads it. These rows charge both, which raises the bound most on transformers
(`benchmarks/investigations/retention_bounds.py`).

The argument, for any valid plan (R, S) within the budget, with L_j the last stage that reads node j:

Tails. t_j = 1 if some stage s > L_j computes j. Those computations are in no gap of j (gaps end at L_j) and not in
stage j (they are recomputations, at j's recompute cost c'_j), so the plan's cost is at least the retention objective
plus sum_j c'_j t_j (objective).

Held columns, for stages t of `stages` (the stages whose retention row can bind, where memory is worth charging):
* w[g, t], for a gap g = (a, b] of node i and a < t < b: i is held into stage t + 1 (S[t + 1, i] = 1), so it is live
  at every moment of stage t.
* h[j, t], for t > L_j: t_j = 0 and j is held into stage t + 1, so j is live at every moment of stage t.
Each charges its node's bytes to the stage row of t (`checkmate.bounds.retention`). The nodes are distinct from the
row's others: i has no user strictly inside its gap (so it is neither node t nor an input of t) and its gap is
recomputed, not kept (the row counts kept gaps only); j is read by nothing after L_j < t; two gaps of one node, or a
gap and a tail, never share a stage.

Cover rows. For a gap g = (a, b] of node i with x[i, g] = 1, an input j of i with L_j <= a (dead in the gap) and a
stage t of `stages` with a < t < b:  w[g, t] + h[j, t] + t_j >= x[i, g]. Valid: let s be the last stage of (a, b]
that computes i. If t >= s, i is needed at b and not computed in (s, b], so S[u, i] = 1 for u in (s, b] (the
paper's 1b, 1c), u = t + 1 included: w = 1. If t < s, j is live when i runs in stage s > L_j: either stage s
computes j (t_j = 1), or S[s, j] = 1, and then, if no stage after L_j computes j, S[u, j] = 1 for every u in
(L_j, s] (1c), u = t + 1 included: h = 1.

Tail rows. For an input j of node i with L_j < L_i, and a stage t of `stages` with L_j < t <= L_i:
h[j, t] + t_j >= t_i. Valid by the same chain: a stage s > L_i computing i needs j live then.

Order rows. h[j, t] >= h[j, t'] for stages t < t' of `stages`: if t_j = 0 and j is held into t' + 1, nothing after
L_j computed it, so it is held into every stage of (L_j, t' + 1].

x and t are binary; w and h may be continuous (each appears only where a larger value costs memory, so an optimum
takes the least value the rows allow, which is 0 or 1 when x and t are integral).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from checkmate.bounds.gaps import Gaps, Rows, last_use
from checkmate.graph import Graph
from checkmate.milp.formulation import expand_ranges


@dataclass(frozen=True)
class InputCover:
    """The columns the input cover adds after the retention MILP's gap columns, and its rows.

    Attributes:
        tail_nodes: int64[n]: column `first + k` is t_j for j = tail_nodes[k] (binary, cost c'_j, j's recompute
            cost).
        held_node, held_stage: int64[m]: column `first + n + k` is node held_node[k] live all through stage
            held_stage[k] (w or h of the module doc; continuous in [0, 1], no cost).
        rows: the cover, tail and order rows (coefficients 0 and +-1, lower side 0), in global column numbers.
    """

    tail_nodes: np.ndarray
    held_node: np.ndarray
    held_stage: np.ndarray
    rows: Rows

    @property
    def num_columns(self) -> int:
        return int(self.tail_nodes.size + self.held_node.size)


def input_cover(graph: Graph, gaps: Gaps, stages: np.ndarray) -> InputCover:
    """The input cover of `graph` for its retention gaps, charging memory at `stages` (sorted stage numbers); see
    the module doc. Columns are numbered from gaps.node.size (after the gap columns)."""
    T = graph.size
    last = last_use(graph)
    first_input = np.searchsorted(graph.edges[:, 1], np.arange(T + 1))
    # cover rows: (gap, dead input, stage)
    owner, position = expand_ranges(first_input[gaps.node], first_input[gaps.node + 1])
    gap, j = owner, graph.edges[position, 0]
    dead = (graph.memory[j] > 0) & (last[j] <= gaps.a[gap])
    gap, j = gap[dead], j[dead]
    pair, at = expand_ranges(np.searchsorted(stages, gaps.a[gap] + 1), np.searchsorted(stages, gaps.b[gap]))
    cover_gap, cover_input, cover_stage = gap[pair], j[pair], stages[at]
    # tail rows: closed over the inputs of every node with a tail
    tail_user, tail_input, tail_stage = [], [], []
    known = np.unique(cover_input)
    frontier = known
    while frontier.size:
        owner, position = expand_ranges(first_input[frontier], first_input[frontier + 1])
        user, j = frontier[owner], graph.edges[position, 0]
        feeds = (graph.memory[j] > 0) & (last[j] < last[user])
        user, j = user[feeds], j[feeds]
        pair, at = expand_ranges(np.searchsorted(stages, last[j] + 1), np.searchsorted(stages, last[user] + 1))
        tail_user.append(user[pair])
        tail_input.append(j[pair])
        tail_stage.append(stages[at])
        frontier = np.setdiff1d(j[pair], known)
        known = np.union1d(known, frontier)
    users, inputs, stages_of_tails = _joined(tail_user), _joined(tail_input), _joined(tail_stage)
    G = gaps.node.size
    tail_nodes = known
    tail_column = np.full(T, -1, dtype=np.int64)
    tail_column[tail_nodes] = G + np.arange(tail_nodes.size)
    first_held = G + tail_nodes.size
    w_keys, w_index = np.unique(cover_gap * T + cover_stage, return_inverse=True)
    h_keys, h_index = np.unique(
        np.concatenate([cover_input * T + cover_stage, inputs * T + stages_of_tails]), return_inverse=True
    )
    w_column = first_held + w_index
    h_column = first_held + w_keys.size + h_index
    cover_h, tails_h = h_column[: cover_gap.size], h_column[cover_gap.size :]
    h_node, h_stage = h_keys // T, h_keys % T
    same_node = h_node[1:] == h_node[:-1]  # h_keys are sorted by node, then stage
    earlier = first_held + w_keys.size + np.flatnonzero(same_node)
    rows = _rows(
        # w[g, t] + h[j, t] + t_j - x[i, g] >= 0
        [w_column, cover_h, tail_column[cover_input], cover_gap],
        # h[j, t] + t_j - t_i >= 0
        [tails_h, tail_column[inputs], tail_column[users]],
        # h[j, t] - h[j, t'] >= 0
        [earlier, earlier + 1],
    )
    return InputCover(
        tail_nodes=tail_nodes,
        held_node=np.concatenate([gaps.node[w_keys // T], h_node]),
        held_stage=np.concatenate([w_keys % T, h_stage]),
        rows=rows,
    )


def _joined(parts: list[np.ndarray]) -> np.ndarray:
    return np.concatenate([np.zeros(0, dtype=np.int64), *parts])


def _rows(cover: list[np.ndarray], tails: list[np.ndarray], order: list[np.ndarray]) -> Rows:
    """Rows sum(+1 columns) - (last column) >= 0, from each family's column arrays (one row per entry)."""
    rows, cols, values = [], [], []
    first = 0
    for family in (cover, tails, order):
        count = family[0].size
        for position, columns in enumerate(family):
            rows.append(first + np.arange(count))
            cols.append(columns)
            values.append(np.full(count, -1.0 if position == len(family) - 1 else 1.0))
        first += count
    return Rows(
        rows=np.concatenate(rows),
        cols=np.concatenate(cols),
        values=np.concatenate(values),
        lower=np.zeros(first),
    )
