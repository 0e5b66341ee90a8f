"""The MILP's moves to host memory (`checkmate.moved`): their columns and rows. Not part of the paper.

Variables, on a graph with a `host_link`:
    C[t, i] (binary) where R[t, i] exists and node i has bytes (M_i > 0): node i's output copied to host memory
        during stage t.
    P[t, i] (binary) where S[t, i] exists, M_i > 0 and t >= i + 2: copied back for stage t.
    O[t, i] (continuous, in [0, 1]) where P[t, i] exists: i has been copied out by stage t - 2;
        O[t, i] <= O[t - 1, i] + C[t - 2, i], so O[t, i] <= sum_{s <= t - 2} C[s, i] with O(T^2) nonzeros.
    X[t] (continuous, >= 0): the time stage t's copies out and the copies in for stage t + 1 add to its compute
        (`checkmate.moved`'s time model); it joins (1a).
Rows (the rules of `checkmate.moved`):
    (m1) C[t, i] <= R[t, i] + S[t, i]; sum_t C[t, i] <= 1.
    (m2) P[t, i] <= O[t, i], with O's recursion above.
    (m3) P[t, i] + R[t, i] <= 1; P[t, i] + S[t, i] <= 1.
    (m4) sum_t sum_i M_i C[t, i] <= the link's host_memory, when it has one.
    (1b) and (1c) take P as a third source: `dependency_terms` and `persistence_terms` give the extra nonzeros.
    (2) U[t, 0] gains M_i P[t, i] (the value) and M_i P[t + 1, i] (the buffer of its copy, filled in stage t).
    FREE[t, (i, k)] + C[t, i] <= 1: a value being copied out stays to the end of its stage.
    X[t] >= sum_i out_i C[t, i] - overlap * sum_k c[t, k] R[t, k], and X[t] >= the same with in_i P[t + 1, i].
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from checkmate.graph import Graph
from checkmate.milp.columns import numbered
from checkmate.milp.row_block import RowBlock
from checkmate.moved import Moves, exposed_transfer_times, on_host_in_time


@dataclass(frozen=True)
class MoveColumns:
    """Where the moves' variables live: C_col, P_col, O_col int64[T, T] (-1 where none), X_col int64[T]; all empty
    on a graph without a host link."""

    C_col: np.ndarray
    P_col: np.ndarray
    O_col: np.ndarray
    X_col: np.ndarray

    @property
    def end(self) -> int:
        """One past the last column, or -1 when there are none."""
        return int(self.X_col[-1]) + 1 if self.X_col.size else -1


@dataclass(frozen=True)
class Terms:
    """Nonzeros to add to rows built elsewhere: (row, column, value)."""

    rows: np.ndarray
    cols: np.ndarray
    values: np.ndarray


def move_columns(graph: Graph, R_col: np.ndarray, S_col: np.ndarray, first: int) -> MoveColumns:
    """Number the moves' variables from column `first` (none without a host link)."""
    T = graph.size
    if graph.host_link is None:
        empty = np.full((T, T), -1, dtype=np.int64)
        return MoveColumns(empty, empty, empty, np.zeros(0, dtype=np.int64))
    stages, nodes = np.arange(T)[:, None], np.arange(T)[None, :]
    movable = (graph.memory > 0)[None, :]
    copy_out = (R_col >= 0) & movable
    copy_in = (S_col >= 0) & (stages >= nodes + 2) & movable
    C_col = numbered(copy_out, first)
    P_col = numbered(copy_in, first + int(copy_out.sum()))
    O_col = numbered(copy_in, first + int(copy_out.sum() + copy_in.sum()))
    after = first + int(copy_out.sum()) + 2 * int(copy_in.sum())
    return MoveColumns(C_col, P_col, O_col, after + np.arange(T))


def dependency_terms(columns: MoveColumns, stage: np.ndarray, source: np.ndarray) -> Terms:
    """-P[t, i] in the (1b) row of each (stage t, source i) pair given in row order."""
    P = columns.P_col[stage, source]
    has = np.flatnonzero(P >= 0)
    return Terms(has, P[has], -np.ones(has.size))


def persistence_terms(columns: MoveColumns, stage: np.ndarray, node: np.ndarray) -> Terms:
    """-P[t - 1, i] in the (1c) row of each S[t, i] given in row order."""
    P = columns.P_col[stage - 1, node]
    has = np.flatnonzero(P >= 0)
    return Terms(has, P[has], -np.ones(has.size))


def memory_terms(columns: MoveColumns, U_row: np.ndarray, sizes: np.ndarray) -> Terms:
    """-M_i P[t, i] and -M_i P[t + 1, i] in the (2) row of U[t, 0] (`U_row[t, 0]` its row)."""
    stage, node = np.nonzero(columns.P_col >= 0)
    ahead = stage > 0
    return Terms(
        np.concatenate([U_row[stage, 0], U_row[stage[ahead] - 1, 0]]),
        np.concatenate([columns.P_col[stage, node], columns.P_col[stage[ahead], node[ahead]]]),
        -np.concatenate([sizes[node], sizes[node[ahead]]]).astype(np.float64),
    )


def _block(entries: list[tuple[np.ndarray, np.ndarray, np.ndarray]], lower: np.ndarray, upper: np.ndarray) -> RowBlock:
    rows, cols, values = (np.concatenate([entry[part] for entry in entries]) for part in range(3))
    return RowBlock(rows.astype(np.int64), cols.astype(np.int64), values.astype(np.float64), lower, upper)


def move_rows(
    graph: Graph,
    columns: MoveColumns,
    R_col: np.ndarray,
    S_col: np.ndarray,
    free: tuple[np.ndarray, np.ndarray, np.ndarray],
) -> RowBlock:
    """(m1)-(m3), O's recursion, the frees held back by a copy out and the exposed transfer times (module doc).
    `free` is (FREE columns, their stages, their sources)."""
    link = graph.host_link
    if link is None:
        empty = np.zeros(0)
        return RowBlock(empty.astype(np.int64), empty.astype(np.int64), empty, empty, empty)
    T = graph.size
    entries: list[tuple[np.ndarray, np.ndarray, np.ndarray]] = []
    lower: list[np.ndarray] = []
    upper: list[np.ndarray] = []
    count = 0

    def add(rows_of: list[tuple[np.ndarray, np.ndarray, float | np.ndarray]], n: int, low: float, high: float) -> None:
        nonlocal count
        for local, cols, values in rows_of:
            entries.append((count + local, cols, np.broadcast_to(values, cols.shape)))
        lower.append(np.full(n, low))
        upper.append(np.full(n, high))
        count += n

    # (m1) C[t, i] - R[t, i] - S[t, i] <= 0
    stage, node = np.nonzero(columns.C_col >= 0)
    n = stage.size
    held = S_col[stage, node]
    has_held = np.flatnonzero(held >= 0)
    add([(np.arange(n), columns.C_col[stage, node], 1.0), (np.arange(n), R_col[stage, node], -1.0),
         (has_held, held[has_held], -1.0)], n, -np.inf, 0.0)  # fmt: skip
    # (m1) sum_t C[t, i] <= 1
    add([(node, columns.C_col[stage, node], 1.0)], T, -np.inf, 1.0)
    # (m4) sum_t sum_i M_i C[t, i] <= host_memory (in bytes)
    if link.host_memory is not None:
        sizes = graph.memory.astype(np.float64)
        add([(np.zeros(stage.size, dtype=np.int64), columns.C_col[stage, node], sizes[node])], 1, -np.inf,
            float(link.host_memory))  # fmt: skip
    # (m2) P[t, i] - O[t, i] <= 0 and O[t, i] - O[t - 1, i] - C[t - 2, i] <= 0
    stage, node = np.nonzero(columns.P_col >= 0)
    n = stage.size
    rows = np.arange(n)
    before = columns.O_col[stage - 1, node]
    has_before = np.flatnonzero(before >= 0)
    copied = columns.C_col[stage - 2, node]
    has_copied = np.flatnonzero(copied >= 0)
    add([(rows, columns.P_col[stage, node], 1.0), (rows, columns.O_col[stage, node], -1.0)], n, -np.inf, 0.0)
    add([(rows, columns.O_col[stage, node], 1.0), (has_before, before[has_before], -1.0),
         (has_copied, copied[has_copied], -1.0)], n, -np.inf, 0.0)  # fmt: skip
    # (m3) P[t, i] + R[t, i] <= 1 and P[t, i] + S[t, i] <= 1
    computed = R_col[stage, node]
    has_computed = np.flatnonzero(computed >= 0)
    add([(np.arange(has_computed.size), columns.P_col[stage[has_computed], node[has_computed]], 1.0),
         (np.arange(has_computed.size), computed[has_computed], 1.0)], has_computed.size, -np.inf, 1.0)  # fmt: skip
    add([(rows, columns.P_col[stage, node], 1.0), (rows, S_col[stage, node], 1.0)], n, -np.inf, 1.0)
    # FREE[t, (i, k)] + C[t, i] <= 1
    free_col, free_stage, free_source = free
    copying = columns.C_col[free_stage, free_source]
    has_copy = np.flatnonzero(copying >= 0)
    m = has_copy.size
    add([(np.arange(m), free_col[has_copy], 1.0), (np.arange(m), copying[has_copy], 1.0)], m, -np.inf, 1.0)
    # X[t] - sum_i out_i C[t, i] + overlap * sum_k c[t, k] R[t, k] >= 0, and the same with the copies in for t + 1
    run_stage, run_node = np.nonzero(R_col >= 0)
    prices = np.where(run_stage == run_node, graph.costs[run_node], graph.recompute_costs[run_node])
    out_stage, out_node = np.nonzero(columns.C_col >= 0)
    out_costs = link.to_host_costs(graph.memory)
    add([(np.arange(T), columns.X_col, 1.0), (out_stage, columns.C_col[out_stage, out_node], -out_costs[out_node]),
         (run_stage, R_col[run_stage, run_node], link.overlap * prices)], T, 0.0, np.inf)  # fmt: skip
    in_stage, in_node = np.nonzero(columns.P_col >= 0)
    in_costs = link.to_device_costs(graph.memory)
    add([(np.arange(T), columns.X_col, 1.0), (in_stage - 1, columns.P_col[in_stage, in_node], -in_costs[in_node]),
         (run_stage, R_col[run_stage, run_node], link.overlap * prices)], T, 0.0, np.inf)  # fmt: skip
    return _block(entries, np.concatenate(lower), np.concatenate(upper))


def objective_columns(columns: MoveColumns) -> np.ndarray:
    """The columns (1a) gains at cost 1: the exposed transfer times X."""
    return columns.X_col


def integer_columns(columns: MoveColumns) -> np.ndarray:
    """The binary columns: C and P."""
    return np.concatenate([columns.C_col[columns.C_col >= 0], columns.P_col[columns.P_col >= 0]])


def decode_moves(x: np.ndarray, columns: MoveColumns) -> Moves:
    """The moves of an integral solution vector (none on a graph without a host link)."""
    if not columns.X_col.size:
        return Moves()
    return Moves(_read(x, columns.C_col), _read(x, columns.P_col))


def _read(x: np.ndarray, col: np.ndarray) -> np.ndarray:
    matrix = np.zeros(col.shape, dtype=bool)
    matrix[col >= 0] = x[col[col >= 0]] > 0.5
    return matrix


def encode_moves(x: np.ndarray, graph: Graph, columns: MoveColumns, moves: Moves, stage_compute: np.ndarray) -> None:
    """Write `moves` (valid for the plan, `checkmate.moved.check_moves`) and what they imply (O, X) into the
    solution vector `x`: a warm start."""
    if not columns.X_col.size:
        return
    T = graph.size
    out, back = moves.copied_out(T), moves.copied_in(T)
    x[columns.C_col[out]] = 1.0
    x[columns.P_col[back]] = 1.0
    ready = on_host_in_time(out)
    x[columns.O_col[columns.O_col >= 0]] = ready[columns.O_col >= 0]
    x[columns.X_col] = exposed_transfer_times(graph.memory, graph.host_link, moves, stage_compute)
