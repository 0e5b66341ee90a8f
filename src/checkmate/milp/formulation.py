"""The paper's MILP (eq. 9), assembled once as sparse matrices, and the one place that decodes R and S.

Variables (only those that can be nonzero are created):
    R[t, i], i <= t: node i computed in stage t. R[t, t] is fixed to 1 (8a); R is lower triangular (8c).
    S[t, i], i < t: node i held into stage t. S is strictly lower triangular (8b).
    For i < t, R[t, i] and S[t, i] exist only when some descendant of i is t or later: otherwise nothing computed
        from i in stage t can reach node t or a checkpoint that is ever used, so an optimal plan can drop it.
    U[t, k], k <= t: live units just after node k in stage t (eq. 2, 3); U <= budget, in units. What the nodes run
        so far retain to the end of the step (`Node.retained`: gradients when `.grad` starts empty) is taken off the
        budget of each moment: the retained units of nodes before t, and of node t itself from its run (k = t).
        A node k with workspace W_k (bytes it holds only while it runs) adds the row U[t, k] + W_k R[t, k] <= budget
        for each R[t, k]: the moment node k runs holds U[t, k] plus its workspace (not part of the paper). W_k is
        the node's workspace in stage k and its recompute workspace in later stages.
    FREE[t, (i, k)] per edge (i, k) with k < t (FREE[t, k, k] eliminated, section 4.8; FREE at k = t frees memory
        after the stage's last computation and so never matters), created only when R[t, k] exists and node t is
        not a user of i (that user would be a hazard fixed to 1).
    G[t, v], A[t, v] per fetched value v (`Graph.fetched`, `checkmate.fetched`) and stage t: G = 1 when v is present
        in stage t, A >= G[t, v] - G[t-1, v] its fetch there (continuous). G[t, v] >= R[t, i] for each reader i;
        G[t, v] <= G[t+1, v] from v's backward_start to its last use, G = 1 there and 0 after (so no reader runs
        after it: a restriction of `checkmate.fetched`'s rules); kept values G = 1 from their first reader to the
        last use; a value released before the backward G = 0 at its backward_start. v's bytes join U[t, 0] (eq. 2)
        and so every U[t, k] of the stage; its fetch's workspace times A[t, v] joins the stage's opening row (the
        fetch runs at the stage's start); on a graph that prefetches, its bytes and its in-flight workspace join
        U[t - 1, 0] with A[t, v] (the fetch's buffer). A is exact in these rows where it is at its least,
        G[t, v] - G[t-1, v], and above it only over-counts. Each fetch costs
        c_v A[t, v] in (1a), and each value's release (`release_cost` r_v, once at its last use) r_v on the fixed
        R[last_use, last_use]. With a graph's fetch_overlap > 0, the link's slots k = 0 .. T + 1 instead
        (`checkmate.fetched`'s time model, `checkmate.link_schedule`): L[k, v] >= 0, the part of v's release run in
        slot k (from last_use + 2), sum_k L[k, v] = r_v, and E[k] >= sum_v c_v A[k, v] + sum_v L[k, v] - overlap *
        sum_i c[k-1, i] R[k-1, i], E >= 0, the wait at slot k, is added to (1a). Not in the paper.
    C[t, i], P[t, i], O[t, i] and X[t] on a graph with a host link: copies of node i's output to host memory and back,
        decided with R and S (`checkmate.milp.moves`, `checkmate.moved`). Not in the paper.
FREE is continuous: the product of eq. 5 is linearised with one row per factor (FREE <= R[t, k],
FREE <= 1 - S[t+1, i], FREE <= 1 - R[t, j] for later users j), which is exact for binary R, S and tighter than
the aggregated rows (7b, 7c). (7b) itself is omitted: it only forces FREE up, which the budget rows never resist.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import scipy.sparse as sp

from checkmate.fetched import default_presence, fetch_link_schedule, held_in_stages, rises
from checkmate.graph import Graph
from checkmate.milp.columns import numbered
from checkmate.milp.moves import (
    MoveColumns,
    decode_moves,
    dependency_terms,
    encode_moves,
    integer_columns,
    memory_terms,
    move_columns,
    move_rows,
    objective_columns,
    persistence_terms,
    unbounded_columns,
)
from checkmate.milp.problem import MilpProblem
from checkmate.milp.row_block import RowBlock
from checkmate.milp.scaling import MemoryScale
from checkmate.moved import NO_MOVES, Moves
from checkmate.simulate import stage_compute


@dataclass(frozen=True)
class VariableIndex:
    """Where R, S, U and FREE live in the flat variable vector (the inverse data of `encode`).

    R_col, S_col, U_col are int64[T, T] column numbers, -1 where no variable exists. FREE variable f
    belongs to stage free_stage[f] and edge free_edge[f] of graph.edges; the later-user rows pair FREE
    variable later_free[p] with R[free_stage, later_user[p]]. G_col and A_col are int64[T, F], the presence and
    the fetch of each fetched value in each stage; E_col int64[T + 2] (empty without fetched values or without their
    overlap, `Graph.fetch_overlap`) the wait at each slot of the link, release_col int64[T + 2, F] (-1 where none)
    the part of each value's release run there. `moves` numbers the variables of the moves to
    host memory (`checkmate.milp.moves`; none without the graph's host link).
    """

    T: int
    R_col: np.ndarray
    S_col: np.ndarray
    U_col: np.ndarray
    free_col: np.ndarray
    free_stage: np.ndarray
    free_edge: np.ndarray
    later_free: np.ndarray
    later_user: np.ndarray
    G_col: np.ndarray
    A_col: np.ndarray
    E_col: np.ndarray
    release_col: np.ndarray
    scale: MemoryScale
    budget_units: float
    moves: MoveColumns

    @property
    def num_variables(self) -> int:
        if self.moves.end >= 0:
            return self.moves.end
        if self.release_col.size and self.release_col.max() >= 0:
            return int(self.release_col.max()) + 1
        if self.E_col.size:
            return int(self.E_col.max()) + 1
        if self.A_col.size:
            return int(self.A_col.max()) + 1
        return int(self.free_col[-1]) + 1 if self.free_col.size else int(self.U_col.max()) + 1


def expand_ranges(starts: np.ndarray, stops: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """For each owner o, every value in range(starts[o], stops[o]): returns (owner, value) arrays."""
    counts = np.maximum(stops - starts, 0)
    owner = np.repeat(np.arange(starts.size), counts)
    offsets = np.cumsum(counts) - counts
    value = np.arange(int(counts.sum())) - np.repeat(offsets, counts) + np.repeat(starts, counts)
    return owner, value


def _graph_arrays(graph: Graph) -> tuple[np.ndarray, np.ndarray]:
    """(reach int64[T]: the latest descendant of each node, -1 for sinks; adjacency bool[T, T])."""
    T = graph.size
    edges = graph.edges
    adjacency = np.zeros((T, T), dtype=bool)
    adjacency[edges[:, 0], edges[:, 1]] = True
    reach = np.full(T, -1, dtype=np.int64)
    for node in range(T - 1, -1, -1):
        for user in graph.users[node]:
            reach[node] = max(reach[node], user, reach[user])
    return reach, adjacency


def _free_variables(graph: Graph, R_col: np.ndarray, adjacency: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(stage, edge) of every FREE variable, ordered by edge then stage."""
    edges = graph.edges
    edge, stage = expand_ranges(edges[:, 1] + 1, np.full(len(edges), graph.size))
    keep = (R_col[stage, edges[edge, 1]] >= 0) & ~adjacency[edges[edge, 0], stage]
    return stage[keep], edge[keep]


def _later_users(graph: Graph, free_lookup: np.ndarray, R_col: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Pairs (FREE variable f for (t, (i, k)), user j of i with k < j < t and R[t, j] existing)."""
    edges = graph.edges
    by_source = np.lexsort((edges[:, 1], edges[:, 0]))
    sources = edges[by_source, 0]
    group_end = np.searchsorted(sources, sources, side="right")
    first, second = expand_ranges(np.arange(len(sources)) + 1, group_end)
    earlier, later = by_source[first], by_source[second]
    pair, stage = expand_ranges(edges[later, 1] + 1, np.full(len(later), graph.size))
    free = free_lookup[stage, earlier[pair]]
    user = edges[later[pair], 1]
    keep = (free >= 0) & (R_col[stage, user] >= 0)
    return free[keep], user[keep]


def _dependency_rows(graph: Graph, R_col: np.ndarray, S_col: np.ndarray, moves: MoveColumns) -> RowBlock:
    """(1b) R[t, j] <= R[t, i] + S[t, i] (+ P[t, i], a copy back from host memory) for every edge (i, j) and stage
    t >= j."""
    edges = graph.edges
    edge, stage = expand_ranges(edges[:, 1], np.full(len(edges), graph.size))
    source, target = edges[edge, 0], edges[edge, 1]
    keep = R_col[stage, target] >= 0
    stage, source, target = stage[keep], source[keep], target[keep]
    row = np.arange(stage.size)
    held = S_col[stage, source]
    has_held = held >= 0
    copied_in = dependency_terms(moves, stage, source)
    return RowBlock(
        rows=np.concatenate([row, row, row[has_held], copied_in.rows]),
        cols=np.concatenate([R_col[stage, target], R_col[stage, source], held[has_held], copied_in.cols]),
        values=np.concatenate([np.ones(row.size), -np.ones(row.size), -np.ones(int(has_held.sum())), copied_in.values]),
        lower=np.full(row.size, -np.inf),
        upper=np.zeros(row.size),
    )


def _persistence_rows(R_col: np.ndarray, S_col: np.ndarray, moves: MoveColumns) -> RowBlock:
    """(1c) S[t, i] <= R[t-1, i] + S[t-1, i] (+ P[t-1, i], a copy back) for every existing S[t, i]."""
    stage, node = np.nonzero(S_col >= 0)
    row = np.arange(stage.size)
    previous = S_col[stage - 1, node]
    has_previous = previous >= 0
    copied_in = persistence_terms(moves, stage, node)
    return RowBlock(
        rows=np.concatenate([row, row, row[has_previous], copied_in.rows]),
        cols=np.concatenate([S_col[stage, node], R_col[stage - 1, node], previous[has_previous], copied_in.cols]),
        values=np.concatenate(
            [np.ones(row.size), -np.ones(row.size), -np.ones(int(has_previous.sum())), copied_in.values]
        ),
        lower=np.full(row.size, -np.inf),
        upper=np.zeros(row.size),
    )


def _memory_rows(graph: Graph, index: VariableIndex) -> RowBlock:
    """(2) U[t,0] = sum_i M_i S[t,i] + M_0 R[t,0] + sum_v M_v G[t,v] (+ sum_v (M_v + F_v) A[t+1,v] on a graph that
    prefetches, with F the prefetch's in-flight workspace, `checkmate.fetched`; + sum_i M_i (P[t,i] + B[t,i]) with
    moves, `checkmate.milp.moves`); (3)-(4) U[t,k] = U[t,k-1] - sum_i M_i FREE[t,i,k-1] + M_k R[t,k]."""
    sizes = index.scale.sizes.astype(np.float64)
    present_stage, present_value = np.nonzero(index.G_col >= 0)
    if graph.prefetch:  # a fetch of stage t + 1 fills its buffer in stage t
        ahead_stage, ahead_value = np.nonzero(index.A_col[1:] >= 0)
    else:
        ahead_stage = ahead_value = np.zeros(0, dtype=np.int64)
    scale = index.scale
    U_row = index.U_col - index.U_col[0, 0]
    stage, node = np.nonzero(index.U_col >= 0)
    rest = node > 0
    computed = index.R_col[stage, node] >= 0
    held_stage, held_node = np.nonzero(index.S_col >= 0)
    edges = graph.edges
    free_source, free_target = edges[index.free_edge, 0], edges[index.free_edge, 1]
    copied_in = memory_terms(index.moves, U_row, index.scale.sizes)
    return RowBlock(
        rows=np.concatenate(
            [
                copied_in.rows,
                U_row[stage, node],
                U_row[stage[rest], node[rest]],
                U_row[stage[computed], node[computed]],
                U_row[held_stage, 0],
                U_row[index.free_stage, free_target + 1],
                U_row[present_stage, 0],
                U_row[ahead_stage, 0],
            ]
        ),
        cols=np.concatenate(
            [
                copied_in.cols,
                index.U_col[stage, node],
                index.U_col[stage[rest], node[rest] - 1],
                index.R_col[stage[computed], node[computed]],
                index.S_col[held_stage, held_node],
                index.free_col,
                index.G_col[present_stage, present_value],
                index.A_col[ahead_stage + 1, ahead_value],
            ]
        ),
        values=np.concatenate(
            [
                copied_in.values,
                np.ones(stage.size),
                -np.ones(int(rest.sum())),
                -sizes[node[computed]],
                -sizes[held_node],
                sizes[free_source],
                -scale.fetched_sizes[present_value].astype(np.float64),
                -(scale.fetched_sizes + scale.in_flight_workspace)[ahead_value].astype(np.float64),
            ]
        ),
        lower=np.zeros(stage.size),
        upper=np.zeros(stage.size),
    )


def _running_with_workspace(index: VariableIndex) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(stage t, node k, W_k in units) of every R[t, k] that runs with a workspace, in U order."""
    stage, node = np.nonzero((index.U_col >= 0) & (index.R_col >= 0))
    workspace = np.where(stage == node, index.scale.workspace[node], index.scale.recompute_workspace[node])
    held = workspace > 0
    return stage[held], node[held], workspace[held].astype(np.float64)


def moment_usage(index: VariableIndex) -> sp.csr_array:
    """One row per U[t, k], in column order: the units in use while node k runs in stage t, U[t, k] + W_k R[t, k]."""
    stage, node, workspace = _running_with_workspace(index)
    U_cols = index.U_col[index.U_col >= 0]
    first = index.U_col[0, 0]
    return sp.csr_array(
        (
            np.concatenate([np.ones(U_cols.size), workspace]),
            (
                np.concatenate([U_cols - first, index.U_col[stage, node] - first]),
                np.concatenate([U_cols, index.R_col[stage, node]]),
            ),
        ),
        shape=(U_cols.size, index.num_variables),
    )


def moment_retained(index: VariableIndex) -> np.ndarray:
    """float64, one per U[t, k] in column order (the rows of `moment_usage`): the units retained at that moment."""
    stage, node = np.nonzero(index.U_col >= 0)
    return index.scale.retained_at(stage, node).astype(np.float64)


def _workspace_rows(index: VariableIndex) -> RowBlock:
    """U[t, k] + W_k R[t, k] <= budget - retained(t, k) where node k runs with a workspace (U's upper bound covers
    the rest)."""
    stage, node, workspace = _running_with_workspace(index)
    row = np.arange(stage.size)
    return RowBlock(
        rows=np.concatenate([row, row]),
        cols=np.concatenate([index.U_col[stage, node], index.R_col[stage, node]]),
        values=np.concatenate([np.ones(row.size), workspace]),
        lower=np.full(row.size, -np.inf),
        upper=index.budget_units - index.scale.retained_at(stage, node),
    )


def _opening_rows(graph: Graph, index: VariableIndex) -> RowBlock:
    """U[t, 0] - M_0 R[t, 0] + sum_v W_v A[t, v] <= budget - retained before t - O_t for each stage t whose start
    holds more than its values: O_t > 0 outside the plan (`Graph.opening_held`) or a fetch's workspace W_v
    (`checkmate.fetched`): the values held into stage t (eq. 2 without node 0's run) and what stage t holds
    throughout, at the moment before its first computation (not part of the paper)."""
    fetch_stage, fetch_value = np.nonzero(index.A_col >= 0)
    fetches = index.scale.fetch_workspace[fetch_value] > 0
    fetch_stage, fetch_value = fetch_stage[fetches], fetch_value[fetches]
    stage = np.union1d(np.flatnonzero(index.scale.opening > 0), fetch_stage)
    row_of = np.full(index.T, -1, dtype=np.int64)
    row_of[stage] = np.arange(stage.size)
    computes_first = stage[index.R_col[stage, 0] >= 0]
    return RowBlock(
        rows=np.concatenate([row_of[stage], row_of[computes_first], row_of[fetch_stage]]),
        cols=np.concatenate(
            [index.U_col[stage, 0], index.R_col[computes_first, 0], index.A_col[fetch_stage, fetch_value]]
        ),
        values=np.concatenate(
            [
                np.ones(stage.size),
                -np.full(computes_first.size, float(index.scale.sizes[0])),
                index.scale.fetch_workspace[fetch_value].astype(np.float64),
            ]
        ),
        lower=np.full(stage.size, -np.inf),
        upper=index.budget_units - index.scale.retained_before[stage] - index.scale.opening[stage],
    )


def _free_rows(graph: Graph, index: VariableIndex) -> RowBlock:
    """Eq. 5 linearised per factor: FREE <= R[t,k]; FREE + S[t+1,i] <= 1; FREE + R[t,j] <= 1 for later users j."""
    edges = graph.edges
    count = index.free_col.size
    source, target = edges[index.free_edge, 0], edges[index.free_edge, 1]
    next_stage = np.minimum(index.free_stage + 1, index.T - 1)
    held_next = np.where(index.free_stage + 1 < index.T, index.S_col[next_stage, source], -1)
    has_held = np.flatnonzero(held_next >= 0)
    pairs = index.later_free.size
    later_cols = index.R_col[index.free_stage[index.later_free], index.later_user]
    computed_rows = np.arange(count)
    held_rows = count + np.arange(has_held.size)
    later_rows = count + has_held.size + np.arange(pairs)
    return RowBlock(
        rows=np.concatenate([computed_rows, computed_rows, held_rows, held_rows, later_rows, later_rows]),
        cols=np.concatenate(
            [
                index.free_col,
                index.R_col[index.free_stage, target],
                index.free_col[has_held],
                held_next[has_held],
                index.free_col[index.later_free],
                later_cols,
            ]
        ),
        values=np.concatenate([np.ones(count), -np.ones(count), np.ones(2 * has_held.size), np.ones(2 * pairs)]),
        lower=np.full(count + has_held.size + pairs, -np.inf),
        upper=np.concatenate([np.zeros(count), np.ones(has_held.size + pairs)]),
    )


def _presence_rows(graph: Graph, index: VariableIndex) -> RowBlock:
    """G[t, v] - R[t, i] >= 0 for each reader i of v; A[t, v] - G[t, v] + G[t-1, v] >= 0 (A[0, v] - G[0, v] >= 0);
    G[t, v] - G[t+1, v] <= 0 from v's backward_start to its last use (`checkmate.fetched`)."""
    reader_value = np.array([v for v, value in enumerate(graph.fetched) for _ in value.readers], dtype=np.int64)
    reader_node = np.array([i for value in graph.fetched for i in value.readers], dtype=np.int64)
    pair, stage = expand_ranges(reader_node, np.full(reader_node.size, index.T))
    read, node = reader_value[pair], reader_node[pair]
    keep = index.R_col[stage, node] >= 0
    read, node, stage = read[keep], node[keep], stage[keep]
    reads = np.arange(stage.size)
    fetch_stage, fetch_value = np.nonzero(index.A_col >= 0)
    fetch = reads.size + np.arange(fetch_stage.size)
    earlier = fetch_stage > 0
    starts = np.array([value.backward_start for value in graph.fetched], dtype=np.int64)
    ends = np.array([value.last_use for value in graph.fetched], dtype=np.int64)
    settled_value, settled_stage = expand_ranges(starts, ends)
    settled = reads.size + fetch.size + np.arange(settled_stage.size)
    return RowBlock(
        rows=np.concatenate([reads, reads, fetch, fetch, fetch[earlier], settled, settled]),
        cols=np.concatenate(
            [
                index.G_col[stage, read],
                index.R_col[stage, node],
                index.A_col[fetch_stage, fetch_value],
                index.G_col[fetch_stage, fetch_value],
                index.G_col[fetch_stage[earlier] - 1, fetch_value[earlier]],
                index.G_col[settled_stage, settled_value],
                index.G_col[settled_stage + 1, settled_value],
            ]
        ),
        values=np.concatenate(
            [
                np.ones(reads.size),
                -np.ones(reads.size),
                np.ones(fetch.size),
                -np.ones(fetch.size),
                np.ones(int(earlier.sum())),
                np.ones(settled.size),
                -np.ones(settled.size),
            ]
        ),
        lower=np.concatenate([np.zeros(reads.size + fetch.size), np.full(settled.size, -np.inf)]),
        upper=np.concatenate([np.full(reads.size + fetch.size, np.inf), np.zeros(settled.size)]),
    )


def _exposed_rows(graph: Graph, index: VariableIndex) -> RowBlock:
    """The link's slots (`checkmate.fetched`'s time model): per slot k, E[k] - sum_v c_v A[k, v] - sum_v L[k, v] +
    overlap * sum_i c[k-1, i] R[k-1, i] >= 0; per released value v, sum_k L[k, v] = r_v."""
    if not index.E_col.size:
        return RowBlock(*(np.zeros(0, dtype=dtype) for dtype in (np.int64, np.int64, float, float, float)))
    slots = index.T + 2
    fetch_stage, fetch_value = np.nonzero(index.A_col >= 0)
    costs = np.array([value.fetch_cost for value in graph.fetched], dtype=np.float64)
    release_slot, release_value = np.nonzero(index.release_col >= 0)
    released = np.unique(release_value)
    run_stage, run_node = np.nonzero(index.R_col >= 0)
    prices = np.where(run_stage == run_node, graph.costs[run_node], graph.recompute_costs[run_node])
    release_rows = slots + np.searchsorted(released, release_value)
    release_costs = np.array([graph.fetched[v].release_cost for v in released.tolist()], dtype=np.float64)
    return RowBlock(
        rows=np.concatenate([np.arange(slots), fetch_stage, run_stage + 1, release_slot, release_rows]),
        cols=np.concatenate(
            [
                index.E_col,
                index.A_col[fetch_stage, fetch_value],
                index.R_col[run_stage, run_node],
                *(2 * [index.release_col[release_slot, release_value]]),
            ]
        ),
        values=np.concatenate(
            [
                np.ones(slots),
                -costs[fetch_value],
                graph.fetch_overlap * prices,
                -np.ones(release_slot.size),
                np.ones(release_slot.size),
            ]
        ),
        lower=np.concatenate([np.zeros(slots), release_costs]),
        upper=np.concatenate([np.full(slots, np.inf), release_costs]),
    )


def build_index(graph: Graph, scale: MemoryScale, budget_units: float) -> VariableIndex:
    """Number the variables that can be nonzero: R, then S, then U, then FREE."""
    T = graph.size
    reach, adjacency = _graph_arrays(graph)
    stages = np.arange(T)[:, None]
    nodes = np.arange(T)[None, :]
    useful = (nodes < stages) & (stages <= reach[None, :])
    R_col = numbered((nodes == stages) | useful, 0)
    S_col = numbered(useful, int((R_col >= 0).sum()))
    U_col = numbered(nodes <= stages, int((S_col >= 0).sum() + (R_col >= 0).sum()))
    free_stage, free_edge = _free_variables(graph, R_col, adjacency)
    order = np.lexsort((free_edge, free_stage))
    free_stage, free_edge = free_stage[order], free_edge[order]
    free_col = int(U_col.max()) + 1 + np.arange(free_stage.size)
    free_lookup = np.full((T, len(graph.edges)), -1, dtype=np.int64)
    free_lookup[free_stage, free_edge] = np.arange(free_stage.size)
    later_free, later_user = _later_users(graph, free_lookup, R_col)
    after_free = int(free_col[-1]) + 1 if free_col.size else int(U_col.max()) + 1
    fetched = (T, len(graph.fetched))
    G_col = after_free + np.arange(T * fetched[1], dtype=np.int64).reshape(fetched)
    A_col = after_free + T * fetched[1] + np.arange(T * fetched[1], dtype=np.int64).reshape(fetched)
    overlaps = fetched[1] > 0 and graph.fetch_overlap > 0
    E_col = after_free + 2 * T * fetched[1] + np.arange(T + 2 if overlaps else 0, dtype=np.int64)
    released = np.array([value.release_cost > 0 for value in graph.fetched], dtype=bool)
    first_slot = np.array([value.last_use + 2 for value in graph.fetched], dtype=np.int64)
    release_slots = (np.arange(T + 2)[:, None] >= first_slot[None, :]) & released[None, :] & overlaps
    release_col = numbered(release_slots, after_free + 2 * T * fetched[1] + E_col.size)
    after_release = after_free + 2 * T * fetched[1] + E_col.size + int(release_slots.sum())
    moves = move_columns(graph, R_col, S_col, after_release)
    return VariableIndex(
        T=T,
        R_col=R_col,
        S_col=S_col,
        U_col=U_col,
        free_col=free_col,
        free_stage=free_stage,
        free_edge=free_edge,
        later_free=later_free,
        later_user=later_user,
        G_col=G_col,
        A_col=A_col,
        E_col=E_col,
        release_col=release_col,
        scale=scale,
        budget_units=budget_units,
        moves=moves,
    )


def encode(
    graph: Graph, budget_units: float, scale: MemoryScale, *, recompute_backward: bool = True
) -> tuple[MilpProblem, VariableIndex]:
    """Build the MILP: minimise sum_t sum_i c[t, i] R[t, i] (1a) with U[t, k] <= budget_units, where c[t, i] is node
    i's cost for t = i and its recompute cost for t > i (`checkmate.simulate.plan_cost`).

    Args:
        graph: the training graph.
        budget_units: the activation budget (budget minus fixed memory) in units of `scale`; inf for none.
        scale: how bytes map to units (see checkmate.milp.scaling).
        recompute_backward: when False, R[t, i] = 0 for backward nodes i < t (a restriction, not a relaxation:
            every plan of the smaller problem is a plan of the full one; the solver's presolve drops the columns).
    """
    index = build_index(graph, scale, budget_units)
    num_vars = index.num_variables
    edges = graph.edges
    blocks = [
        _dependency_rows(graph, index.R_col, index.S_col, index.moves),
        _persistence_rows(index.R_col, index.S_col, index.moves),
        _memory_rows(graph, index),
        _free_rows(graph, index),
        _workspace_rows(index),
        _opening_rows(graph, index),
        _presence_rows(graph, index),
        _exposed_rows(graph, index),
        move_rows(
            graph, index.moves, index.R_col, index.S_col, (index.free_col, index.free_stage, edges[index.free_edge, 0])
        ),
    ]
    offsets = np.cumsum([0] + [block.lower.size for block in blocks])
    rows = np.concatenate([block.rows + offset for block, offset in zip(blocks, offsets, strict=False)])
    A = sp.csc_array(
        (np.concatenate([b.values for b in blocks]), (rows, np.concatenate([b.cols for b in blocks]))),
        shape=(int(offsets[-1]), num_vars),
    )
    return MilpProblem(
        c=_objective(graph, index, num_vars),
        A=A,
        row_lower=np.concatenate([b.lower for b in blocks]),
        row_upper=np.concatenate([b.upper for b in blocks]),
        col_lower=_column_lower(graph, index, num_vars),
        col_upper=_column_upper(graph, index, num_vars, recompute_backward),
        integer=_integrality(index, num_vars),
    ), index


def _objective(graph: Graph, index: VariableIndex, num_vars: int) -> np.ndarray:
    c = np.zeros(num_vars)
    stage, node = np.nonzero(index.R_col >= 0)
    # (1a) sum R[t, i] c[t, i]: a node's run in its own stage at its cost, every later run at its recompute cost
    c[index.R_col[stage, node]] = np.where(stage == node, graph.costs[node], graph.recompute_costs[node])
    if index.E_col.size:
        c[index.E_col] = 1.0  # the wait at each slot of the link, fetches and releases (not part of the paper)
    else:
        fetch_costs = np.array([value.fetch_cost for value in graph.fetched], dtype=np.float64)
        c[index.A_col] = fetch_costs[None, :]  # no overlap: every fetch at its value's cost (not part of the paper)
        for value in graph.fetched:  # and each release at its cost, on the fixed R[last_use, last_use]
            c[index.R_col[value.last_use, value.last_use]] += value.release_cost
    c[objective_columns(index.moves)] = 1.0  # the exposed time of the moves to host memory and back (not the paper's)
    return c


def _column_lower(graph: Graph, index: VariableIndex, num_vars: int) -> np.ndarray:
    lower = np.zeros(num_vars)
    lower[index.R_col[np.arange(index.T), np.arange(index.T)]] = 1.0  # (8a) R[t, t] = 1
    for v, value in enumerate(graph.fetched):
        lower[index.G_col[value.last_use, v]] = 1.0  # present at its last use
        if value.kept and value.readers:
            lower[index.G_col[min(value.readers) : value.last_use + 1, v]] = 1.0
    return lower


def _column_upper(graph: Graph, index: VariableIndex, num_vars: int, recompute_backward: bool) -> np.ndarray:
    upper = np.ones(num_vars)
    stage, node = np.nonzero(index.U_col >= 0)
    upper[index.U_col[stage, node]] = index.budget_units - index.scale.retained_at(stage, node)  # U[t, k] <= budget
    upper[index.E_col] = np.inf  # the link's waits, in the cost unit
    upper[index.release_col[index.release_col >= 0]] = np.inf  # the parts of the releases, in the cost unit
    upper[unbounded_columns(index.moves)] = np.inf  # waits and the link's work, in the cost unit
    for v, value in enumerate(graph.fetched):
        upper[index.G_col[value.last_use + 1 :, v]] = 0.0  # gone after its last use: no reader runs there
        if value.released_before_backward and value.backward_start < index.T:
            upper[index.G_col[value.backward_start, v]] = 0.0
    if not recompute_backward:
        stage, node = np.nonzero(index.R_col >= 0)
        again = (stage > node) & graph.is_backward[node]
        upper[index.R_col[stage[again], node[again]]] = 0.0
    return upper


def _integrality(index: VariableIndex, num_vars: int) -> np.ndarray:
    integer = np.zeros(num_vars, dtype=bool)
    integer[index.R_col[index.R_col >= 0]] = True  # (1f)
    integer[index.S_col[index.S_col >= 0]] = True
    integer[index.G_col] = True
    integer[integer_columns(index.moves)] = True
    return integer


def decode_fractional(x: np.ndarray, index: VariableIndex) -> tuple[np.ndarray, np.ndarray]:
    """Read R and S (float64[T, T], zero where no variable exists) out of a solution vector; the only code that does."""
    R = np.zeros((index.T, index.T))
    S = np.zeros((index.T, index.T))
    R[index.R_col >= 0] = x[index.R_col[index.R_col >= 0]]
    S[index.S_col >= 0] = x[index.S_col[index.S_col >= 0]]
    return R, S


def decode_presence(x: np.ndarray, index: VariableIndex) -> np.ndarray:
    """The fetched values' presence, bool[T, F], of an integral solution vector."""
    return np.asarray(x[index.G_col] > 0.5, dtype=bool).reshape(index.G_col.shape)


def decode_plan_moves(x: np.ndarray, index: VariableIndex) -> Moves:
    """The moves to host memory of an integral solution vector (none without the graph's host link)."""
    return decode_moves(x, index.moves)


def decode(x: np.ndarray, index: VariableIndex) -> tuple[np.ndarray, np.ndarray]:
    """The 0/1 plan (R, S), bool[T, T], of an integral solution vector."""
    R, S = decode_fractional(x, index)
    return R > 0.5, S > 0.5


def encode_solution(
    graph: Graph,
    index: VariableIndex,
    R: np.ndarray,
    S: np.ndarray,
    presence: np.ndarray | None = None,
    moves: Moves = NO_MOVES,
) -> np.ndarray:
    """The full variable vector of a valid plan (R, S) with the fetched values' `presence` (None: FSDP2's rule,
    `checkmate.fetched.default_presence`) and its `moves` to host memory: a warm start. Useless entries of R and S
    are dropped."""
    presence = default_presence(graph.fetched, R.astype(bool)) if presence is None else presence.astype(bool)
    R = R.astype(bool) & (index.R_col >= 0)
    S = S.astype(bool) & (index.S_col >= 0)
    edges = graph.edges
    source, target = edges[index.free_edge, 0], edges[index.free_edge, 1]
    stage = index.free_stage
    held_next = np.zeros(stage.size, dtype=bool)
    inner = stage + 1 < index.T
    held_next[inner] = S[stage[inner] + 1, source[inner]]
    hazards = np.bincount(index.later_free, weights=R[stage[index.later_free], index.later_user], minlength=stage.size)
    free = R[stage, target] & ~held_next & (hazards == 0) & ~moves.copied_out(index.T)[stage, source]  # eq. 5
    sizes = index.scale.sizes.astype(np.float64)
    freed = np.zeros((index.T, index.T))
    np.add.at(freed, (stage, target), sizes[source] * free)
    freed_before = np.cumsum(freed, axis=1) - freed
    scale = index.scale
    present = held_in_stages(
        presence, graph.prefetch, scale.fetched_sizes.astype(np.float64), scale.in_flight_workspace.astype(np.float64)
    )
    present += (moves.copied_in(index.T) | moves.buffers(index.T)).astype(np.float64) @ sizes  # copies back, buffers
    U = (S @ sizes + present)[:, None] + np.cumsum(R * sizes[None, :], axis=1) - freed_before
    x = np.zeros(index.num_variables)
    x[index.R_col[R]] = 1.0
    x[index.S_col[S]] = 1.0
    x[index.U_col[index.U_col >= 0]] = U[index.U_col >= 0]
    x[index.free_col] = free
    x[index.G_col] = presence
    x[index.A_col] = rises(presence)
    if index.E_col.size:
        link = fetch_link_schedule(graph.fetched, presence, stage_compute(graph, R), graph.fetch_overlap)
        x[index.E_col] = link.exposed
        release_slot, release_value = np.nonzero(index.release_col >= 0)
        x[index.release_col[release_slot, release_value]] = link.done[0][
            release_slot, len(graph.fetched) + release_value
        ]
    encode_moves(x, graph, index.moves, moves, S, stage_compute(graph, R))
    return x
