"""The MILP's moves to host memory (`checkmate.moved`): their columns and rows. Not part of the paper.

Variables, on a graph with a `host_link`, for nodes with bytes (M_i > 0):
    C[t, i] (binary) where R[t, i] exists: node i's output starts its copy to host memory in stage t.
    P[t, i] (binary) where S[t, i] exists and t >= i + 2: copied back for stage t.
    B[s, i] (binary) for i + 1 <= s <= T - 2: stage s holds the buffer of i's next copy back.
    O[s, i] (continuous, in [0, 1]) where B[s, i] exists: i has been copied out before stage s;
        O[s, i] <= O[s - 1, i] + C[s - 1, i], so O[s, i] <= sum_{s' < s} C[s', i] with O(T^2) nonzeros.
    W[s, i] (continuous, in [0, 1]) where C[s, i] exists: s is in the window of i's copy out.
    F[s, i] (continuous, >= 0) where C[s, i] exists: the part of i's copy out done in stage s.
    G[s, i] (continuous, >= 0) where B[s, i] exists: the part of a copy back of i done in stage s;
    Y[s, i] (continuous, >= 0) where B[s, i] exists: what the buffer's run has copied by the end of stage s.
    X[t] (continuous, >= 0): the time the step waits in stage t for copies (`checkmate.moved`'s time model); it
        joins (1a).
Rows (the rules of `checkmate.moved`):
    (m1) C[t, i] <= R[t, i] + S[t, i]; sum_t C[t, i] <= 1.
    (m2) P[t, i] <= B[t - 1, i]; B[s, i] <= B[s + 1, i] + P[s + 1, i]; B[s, i] <= O[s, i], with O's recursion;
         B[s, i] + R[s, i] <= 1, B[s, i] + S[s, i] <= 1, B[s, i] + P[s, i] <= 1.
    (m3) P[t, i] + R[t, i] <= 1; P[t, i] + S[t, i] <= 1.
    (m4) sum_t sum_i M_i C[t, i] <= the link's host_memory, when it has one.
    (1b) and (1c) take P as a third source: `dependency_terms` and `persistence_terms` give the extra nonzeros.
    (2) U[t, 0] gains M_i P[t, i] (the value) and M_i B[t, i] (the buffer of a copy back, filled in stage t).
    FREE[t, (i, k)] + C[t, i] <= 1: a value being copied out stays to the end of its stage.
    The link, as `checkmate.moved.transfer_schedule` runs it:
        window: W[s, i] <= C[s, i] + W[s - 1, i] and W[s, i] <= C[s, i] + S[s + 1, i];
        copy out: F[s, i] <= out_i W[s, i], sum_s F[s, i] >= out_i sum_s C[s, i];
        copy back: G[s, i] <= in_i B[s, i], Y[s, i] <= Y[s - 1, i] + G[s, i], Y[s, i] <= in_i B[s, i] (a run
            starts from nothing), in_i P[t, i] <= Y[t - 1, i];
        each stage, each direction: sum_i F[s, i] (or G[s, i]) <= overlap * sum_k c[s, k] R[s, k] + X[s].
    A schedule of the copies within their windows is what the rows allow, and the least total wait over such
    schedules is what `transfer_schedule` computes for a plan, so the MILP prices a plan's moves as the simulator does.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from checkmate.graph import Graph
from checkmate.milp.columns import numbered
from checkmate.milp.row_block import RowBlock
from checkmate.moved import Moves, copy_out_windows, on_host_by, transfer_schedule


@dataclass(frozen=True)
class MoveColumns:
    """Where the moves' variables live: int64[T, T] column numbers (-1 where none) of C, P, B, O, W, F, G, Y, and
    X_col int64[T]; all empty on a graph without a host link."""

    C_col: np.ndarray
    P_col: np.ndarray
    B_col: np.ndarray
    O_col: np.ndarray
    W_col: np.ndarray
    F_col: np.ndarray
    G_col: np.ndarray
    Y_col: np.ndarray
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
        return MoveColumns(empty, empty, empty, empty, empty, empty, empty, empty, np.zeros(0, dtype=np.int64))
    stages, nodes = np.arange(T)[:, None], np.arange(T)[None, :]
    movable = (graph.memory > 0)[None, :]
    copy_out = (R_col >= 0) & movable
    copy_in = (S_col >= 0) & (stages >= nodes + 2) & movable
    buffer = (stages >= nodes + 1) & (stages <= T - 2) & movable
    masks = (copy_out, copy_in, buffer, buffer, copy_out, copy_out, buffer, buffer)
    columns = []
    for mask in masks:
        columns.append(numbered(mask, first))
        first += int(mask.sum())
    C, P, B, ready, W, F, G, Y = columns
    return MoveColumns(C, P, B, ready, W, F, G, Y, first + np.arange(T))


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
    """-M_i P[t, i] and -M_i B[t, i] in the (2) row of U[t, 0] (`U_row[t, 0]` its row)."""
    in_stage, in_node = np.nonzero(columns.P_col >= 0)
    buffer_stage, buffer_node = np.nonzero(columns.B_col >= 0)
    return Terms(
        np.concatenate([U_row[in_stage, 0], U_row[buffer_stage, 0]]),
        np.concatenate([columns.P_col[in_stage, in_node], columns.B_col[buffer_stage, buffer_node]]),
        -np.concatenate([sizes[in_node], sizes[buffer_node]]).astype(np.float64),
    )


class _Rows:
    """Rows added one family at a time: each family's nonzeros as (local row, column, value) and its bounds."""

    def __init__(self) -> None:
        self.entries: list[tuple[np.ndarray, np.ndarray, np.ndarray]] = []
        self.lower: list[np.ndarray] = []
        self.upper: list[np.ndarray] = []
        self.count = 0

    def add(
        self, terms: list[tuple[np.ndarray, np.ndarray, float | np.ndarray]], n: int, low: float, high: float
    ) -> None:
        for local, cols, values in terms:
            keep = cols >= 0
            self.entries.append((self.count + local[keep], cols[keep], np.broadcast_to(values, cols.shape)[keep]))
        self.lower.append(np.full(n, low))
        self.upper.append(np.full(n, high))
        self.count += n

    def block(self) -> RowBlock:
        rows, cols, values = (np.concatenate([entry[part] for entry in self.entries]) for part in range(3))
        return RowBlock(
            rows.astype(np.int64),
            cols.astype(np.int64),
            values.astype(np.float64),
            np.concatenate(self.lower),
            np.concatenate(self.upper),
        )


def _at(columns: np.ndarray, stage: np.ndarray, node: np.ndarray) -> np.ndarray:
    """The columns at (stage, node), -1 where the stage is out of range."""
    inside = (stage >= 0) & (stage < columns.shape[0])
    found = np.full(stage.shape, -1, dtype=np.int64)
    found[inside] = columns[stage[inside], node[inside]]
    return found


def move_rows(
    graph: Graph,
    columns: MoveColumns,
    R_col: np.ndarray,
    S_col: np.ndarray,
    free: tuple[np.ndarray, np.ndarray, np.ndarray],
) -> RowBlock:
    """(m1)-(m4), the buffers' runs, O's recursion, the frees held back by a copy out and the link's rows (module
    doc). `free` is (FREE columns, their stages, their sources)."""
    link = graph.host_link
    if link is None:
        empty = np.zeros(0)
        return RowBlock(empty.astype(np.int64), empty.astype(np.int64), empty, empty, empty)
    T = graph.size
    rows = _Rows()
    one = 1.0
    # (m1) C[t, i] - R[t, i] - S[t, i] <= 0; sum_t C[t, i] <= 1; (m4) sum M_i C[t, i] <= host_memory
    stage, node = np.nonzero(columns.C_col >= 0)
    local = np.arange(stage.size)
    C = columns.C_col[stage, node]
    rows.add([(local, C, one), (local, R_col[stage, node], -one), (local, S_col[stage, node], -one)], stage.size,
             -np.inf, 0.0)  # fmt: skip
    rows.add([(node, C, one)], T, -np.inf, 1.0)
    if link.host_memory is not None:
        rows.add([(np.zeros(stage.size, dtype=np.int64), C, graph.memory[node].astype(np.float64))], 1, -np.inf,
                 float(link.host_memory))  # fmt: skip
    # the copy out's window and work: W - C - W[s - 1] <= 0, W - C - S[s + 1] <= 0, F - out W <= 0,
    # sum_s F - out sum_s C >= 0
    out = link.to_host_costs(graph.memory)
    W, F = columns.W_col[stage, node], columns.F_col[stage, node]
    rows.add([(local, W, one), (local, C, -one), (local, _at(columns.W_col, stage - 1, node), -one)], stage.size,
             -np.inf, 0.0)  # fmt: skip
    rows.add([(local, W, one), (local, C, -one), (local, _at(S_col, stage + 1, node), -one)], stage.size, -np.inf,
             0.0)  # fmt: skip
    rows.add([(local, F, one), (local, W, -out[node])], stage.size, -np.inf, 0.0)
    rows.add([(node, F, one), (node, C, -out[node])], T, 0.0, np.inf)
    # FREE[t, (i, k)] + C[t, i] <= 1
    free_col, free_stage, free_source = free
    copying = columns.C_col[free_stage, free_source]
    has_copy = np.flatnonzero(copying >= 0)
    m = np.arange(has_copy.size)
    rows.add([(m, free_col[has_copy], one), (m, copying[has_copy], one)], has_copy.size, -np.inf, 1.0)
    # (m3) P + R <= 1, P + S <= 1; (m2) P[t] - B[t - 1] <= 0
    stage, node = np.nonzero(columns.P_col >= 0)
    local = np.arange(stage.size)
    P = columns.P_col[stage, node]
    rows.add([(local, P, one), (local, R_col[stage, node], one)], stage.size, -np.inf, 1.0)
    rows.add([(local, P, one), (local, S_col[stage, node], one)], stage.size, -np.inf, 1.0)
    rows.add([(local, P, one), (local, _at(columns.B_col, stage - 1, node), -one)], stage.size, -np.inf, 0.0)
    # the copy back's work: in P[t] - Y[t - 1] <= 0
    back = link.to_device_costs(graph.memory)
    rows.add([(local, P, back[node]), (local, _at(columns.Y_col, stage - 1, node), -one)], stage.size, -np.inf, 0.0)
    # (m2) B[s] - B[s + 1] - P[s + 1] <= 0; B - O <= 0; O[s] - O[s - 1] - C[s - 1] <= 0; B + R, B + S, B + P <= 1
    stage, node = np.nonzero(columns.B_col >= 0)
    local = np.arange(stage.size)
    B = columns.B_col[stage, node]
    rows.add([(local, B, one), (local, _at(columns.B_col, stage + 1, node), -one),
              (local, _at(columns.P_col, stage + 1, node), -one)], stage.size, -np.inf, 0.0)  # fmt: skip
    ready = columns.O_col[stage, node]
    rows.add([(local, B, one), (local, ready, -one)], stage.size, -np.inf, 0.0)
    rows.add([(local, ready, one), (local, _at(columns.O_col, stage - 1, node), -one),
              (local, _at(columns.C_col, stage - 1, node), -one)], stage.size, -np.inf, 0.0)  # fmt: skip
    for other in (R_col, S_col, columns.P_col):
        rows.add([(local, B, one), (local, other[stage, node], one)], stage.size, -np.inf, 1.0)
    # G - in B <= 0; Y - Y[s - 1] - G <= 0; Y - in B <= 0
    G, Y = columns.G_col[stage, node], columns.Y_col[stage, node]
    rows.add([(local, G, one), (local, B, -back[node])], stage.size, -np.inf, 0.0)
    rows.add([(local, Y, one), (local, _at(columns.Y_col, stage - 1, node), -one), (local, G, -one)], stage.size,
             -np.inf, 0.0)  # fmt: skip
    rows.add([(local, Y, one), (local, B, -back[node])], stage.size, -np.inf, 0.0)
    # each stage, each direction: X[s] + overlap sum_k c[s, k] R[s, k] - sum_i F[s, i] (or G[s, i]) >= 0
    run_stage, run_node = np.nonzero(R_col >= 0)
    prices = np.where(run_stage == run_node, graph.costs[run_node], graph.recompute_costs[run_node])
    lent = (run_stage, R_col[run_stage, run_node], link.overlap * prices)
    for work in (columns.F_col, columns.G_col):
        work_stage, work_node = np.nonzero(work >= 0)
        rows.add([(np.arange(T), columns.X_col, one), lent, (work_stage, work[work_stage, work_node], -one)], T, 0.0,
                 np.inf)  # fmt: skip
    return rows.block()


def objective_columns(columns: MoveColumns) -> np.ndarray:
    """The columns (1a) gains at cost 1: the waits X."""
    return columns.X_col


def unbounded_columns(columns: MoveColumns) -> np.ndarray:
    """The columns with no upper bound: the waits X and the link's work F, G, Y (in the cost unit)."""
    return np.concatenate([columns.X_col, *(col[col >= 0] for col in (columns.F_col, columns.G_col, columns.Y_col))])


def integer_columns(columns: MoveColumns) -> np.ndarray:
    """The binary columns: C, P and B."""
    return np.concatenate([col[col >= 0] for col in (columns.C_col, columns.P_col, columns.B_col)])


def decode_moves(x: np.ndarray, columns: MoveColumns) -> Moves:
    """The moves of an integral solution vector (none on a graph without a host link)."""
    if not columns.X_col.size:
        return Moves()
    return Moves(_read(x, columns.C_col), _read(x, columns.P_col), _read(x, columns.B_col))


def _read(x: np.ndarray, col: np.ndarray) -> np.ndarray:
    matrix = np.zeros(col.shape, dtype=bool)
    matrix[col >= 0] = x[col[col >= 0]] > 0.5
    return matrix


def encode_moves(
    x: np.ndarray, graph: Graph, columns: MoveColumns, moves: Moves, S: np.ndarray, stage_compute: np.ndarray
) -> None:
    """Write `moves` (valid for the plan with holds `S`, `checkmate.moved.check_moves`) and what they imply (O, W,
    the link's schedule F, G, Y, and the waits X) into the solution vector `x`: a warm start."""
    if not columns.X_col.size:
        return
    T = graph.size
    out, back, buffer = moves.copied_out(T), moves.copied_in(T), moves.buffers(T)
    x[columns.C_col[out]] = 1.0
    x[columns.P_col[back]] = 1.0
    x[columns.B_col[buffer]] = 1.0
    _write(x, columns.O_col, on_host_by(out).astype(np.float64))
    _write(x, columns.W_col, copy_out_windows(S, moves).astype(np.float64))
    schedule = transfer_schedule(graph.memory, graph.host_link, moves, S, stage_compute)
    _write(x, columns.F_col, schedule.to_host)
    _write(x, columns.G_col, schedule.to_device)
    copied = np.zeros((T, T))
    for s in range(T):
        copied[s] = np.where(buffer[s], (copied[s - 1] if s else 0.0) + schedule.to_device[s], 0.0)
    _write(x, columns.Y_col, copied)
    x[columns.X_col] = schedule.exposed


def _write(x: np.ndarray, col: np.ndarray, values: np.ndarray) -> None:
    x[col[col >= 0]] = values[col >= 0]
