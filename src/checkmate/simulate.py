"""The paper's memory model: check a plan (R, S), lower it to steps, and measure its cost and peak.

The cost is the paper's objective (1a) with a recomputation priced apart: node i's run in its own stage costs
`Node.cost`, each run in a later stage `Node.recompute_cost` (`plan_cost`).

Within stage t the nodes with R[t, k] = 1 run in index order. After node k runs, each input i of k
is freed when k is the last consumer of i computed in stage t and i is not held into stage t + 1
(the paper's FREE[t, i, k], eq. 5, with FREE[t, k, k] eliminated as in its section 4.8). What is
still live when a stage ends and is not in S[t + 1] is dropped at the stage boundary. The peak is
the largest live total just after a node is computed, before its dead inputs are freed (U[t, k]),
plus the node's workspace (bytes it holds only while it runs; its recompute workspace in a stage after
its own), the graph's fixed memory, and what nodes retain to the end of the step (`Node.retained`, counted
from the node's own stage on, the moment it first runs included).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from checkmate.errors import InvalidSchedule
from checkmate.fetched import check_presence, default_presence, exposed_fetch_times, fetching_bytes, present_bytes
from checkmate.graph import Graph
from checkmate.moved import NO_MOVES, Moves, buffered_bytes, check_moves, exposed_transfer_times, host_peak


@dataclass(frozen=True)
class Compute:
    """Evaluate node `node` (in stage `stage`); its output becomes live."""

    node: int
    stage: int


@dataclass(frozen=True)
class Free:
    """Release one live copy of node `node`'s output (in stage `stage`)."""

    node: int
    stage: int


Step = Compute | Free


@dataclass(frozen=True)
class Schedule:
    """An explicit program an executor can run, with the simulator's figures for it.

    Attributes:
        steps: the compute and free steps in order.
        cost: total compute cost, and the time of the fetches of the graph's fetched values.
        peak_memory: the largest of `usage` and `openings`.
        usage: bytes in use just after each Compute step, in step order: the paper's U[t, k] plus the fixed memory,
            the computed node's workspace (recompute workspace in a later stage) and the fetched values present.
        presence: bool[T, F], the stages where each of the graph's fetched values is present (F = 0: none).
        stage_start: per stage, bytes in use at its start, before its first computation and after the frees of the
            stage before: the paper's U[t, 0] less node t's output (eq. 2: the values held into the stage) plus what
            `usage` counts beside U.
        moves: the plan's copies to host memory and back (`checkmate.moved`; empty for none).
        host_peak: the most bytes the moves hold in host memory.
        fetched_bytes: per stage, what `usage` counts for the graph's fetched values and their fetches
            (`checkmate.fetched.present_bytes`; empty without fetched values).
        openings: per stage, `stage_start` plus what is held only then: the graph's `opening_held` and the
            workspaces of the fetches that make values present in the stage (`checkmate.fetched.fetching_bytes`;
            empty without either).
    """

    steps: tuple[Step, ...]
    cost: float
    peak_memory: int
    usage: tuple[int, ...] = ()
    presence: np.ndarray = field(default_factory=lambda: np.zeros((0, 0), dtype=bool), compare=False)
    stage_start: tuple[int, ...] = ()
    moves: Moves = NO_MOVES
    host_peak: int = 0
    fetched_bytes: tuple[int, ...] = ()
    openings: tuple[int, ...] = ()

    def stage_peaks(self) -> np.ndarray:
        """int64[T]: the largest of `usage` within each stage (every stage computes at least its own node) and of
        its opening (`openings`)."""
        stages = np.array([step.stage for step in self.steps if isinstance(step, Compute)], dtype=np.int64)
        peaks = np.zeros(int(stages.max(initial=-1)) + 1, dtype=np.int64)
        np.maximum.at(peaks, stages, np.asarray(self.usage, dtype=np.int64))
        return np.maximum(peaks, self.openings) if self.openings else peaks


def check_plan(graph: Graph, R: np.ndarray, S: np.ndarray, moves: Moves = NO_MOVES) -> None:
    """Raise InvalidSchedule naming the first constraint of the paper that (R, S) breaks, or a rule of
    `checkmate.moved` that its `moves` break (a copied-in value is a third source in (1b) and (1c))."""
    T = graph.size
    for name, matrix in (("R", R), ("S", S)):
        if matrix.shape != (T, T):
            raise InvalidSchedule(f"{name} has shape {matrix.shape}; the graph has {T} nodes, so it must be ({T}, {T})")
        if not np.isin(matrix, (0, 1)).all():
            raise InvalidSchedule(f"{name} must hold only 0 and 1")
    check_moves(R, S, moves, graph.memory, graph.host_link)
    R = R.astype(bool)
    S = S.astype(bool)
    missing = np.flatnonzero(~np.diag(R))
    if missing.size:
        raise InvalidSchedule(
            f"(8a) R[{missing[0]}, {missing[0]}] must be 1: stage t computes node t (frontier-advancing)"
        )
    upper_r = np.argwhere(np.triu(R, 1))
    if upper_r.size:
        t, i = upper_r[0]
        raise InvalidSchedule(
            f"(8c) R[{t}, {i}] = 1 computes node {i} before its first stage {i}; R must be lower triangular"
        )
    upper_s = np.argwhere(np.triu(S))
    if upper_s.size:
        t, i = upper_s[0]
        raise InvalidSchedule(
            f"(8b) S[{t}, {i}] = 1 holds node {i} before it was ever computed; S must be strictly lower triangular"
        )
    available = R | S | moves.copied_in(T) if moves.any else R | S
    unheld = np.argwhere(S[1:] & ~available[:-1])
    if unheld.size:
        t, i = unheld[0]
        raise InvalidSchedule(
            f"(1c) S[{t + 1}, {i}] = 1 but node {i} was neither computed nor held in stage {t}: a checkpoint must exist"
        )
    edges = graph.edges
    if edges.size:
        broken = np.argwhere(R[:, edges[:, 1]] & ~available[:, edges[:, 0]])
        if broken.size:
            t, e = broken[0]
            src, dst = edges[e]
            raise InvalidSchedule(
                f"(1b) stage {t} computes node {dst} ({graph.nodes[dst].name!r}) but its input {src} "
                f"({graph.nodes[src].name!r}) is neither computed in that stage nor held "
                f"(R[{t},{src}] = S[{t},{src}] = 0)"
            )


def lower(
    graph: Graph, R: np.ndarray, S: np.ndarray, presence: np.ndarray | None = None, moves: Moves = NO_MOVES
) -> Schedule:
    """Check (R, S), the fetched values' `presence` (None: FSDP2's rule) and the `moves` to host memory, and turn
    them into the explicit compute/free steps, with the simulated cost and peak (`checkmate.moved` for the moves'
    memory and time)."""
    check_plan(graph, R, S, moves)
    R = R.astype(bool)
    S = S.astype(bool)
    presence = default_presence(graph.fetched, R) if presence is None else presence.astype(bool)
    check_presence(graph.fetched, R, presence)
    fetched_bytes = present_bytes(graph.fetched, presence, graph.prefetch)
    T = graph.size
    memory = graph.memory
    workspace, recompute_workspace = graph.workspace, graph.recompute_workspace
    held_before, retained = graph.held_before_stage, graph.retained
    preds = graph.predecessors
    moving = moves.any
    outside_plan = fetched_bytes + buffered_bytes(memory, moves, T) if moving else fetched_bytes
    steps: list[Step] = []
    live = S[0].astype(np.int64)
    current = int(memory @ live)
    usage: list[int] = []
    stage_start: list[int] = []
    for t in range(T):
        if moving:  # the values copied in for stage t are on the device from its start, as held values are
            live += moves.copy_in[t]
            current += int(memory @ moves.copy_in[t])
        stage_start.append(current + int(held_before[t]) + int(outside_plan[t]))
        computed = np.flatnonzero(R[t])
        held_next = S[t + 1] if t + 1 < T else np.zeros(T, dtype=bool)
        last_consumer = _last_consumer_in_stage(preds, computed)
        for k in computed:
            steps.append(Compute(int(k), t))
            live[k] += 1
            current += int(memory[k])
            outside = (held_before[t] + retained[t] if k == t else held_before[t]) + outside_plan[t]
            transient = workspace[k] if k == t else recompute_workspace[k]
            usage.append(current + int(outside) + int(transient))
            for i in preds[k]:
                if last_consumer[i] == k and not held_next[i] and not (moving and moves.copy_out[t, i]):
                    steps.append(Free(i, t))
                    live[i] -= 1
                    current -= int(memory[i])
        drops = live - held_next
        for node in np.flatnonzero(drops):
            steps.extend(Free(int(node), t) for _ in range(int(drops[node])))
        live -= drops
        current -= int(memory @ drops)
    cost = plan_cost(graph, R) + fetch_time(graph, R, presence) + transfer_time(graph, R, S, moves)
    fetching = fetching_bytes(graph.fetched, presence)  # the fetches' workspaces, at the start of their stages
    openings = (  # before each stage's first computation
        tuple(int(held) for held in np.array(stage_start, dtype=np.int64) + graph.held_at_opening + fetching)
        if graph.opening_held or fetching.any()
        else ()
    )
    return Schedule(
        tuple(steps),
        cost,
        max(max(usage), max(openings, default=0)),
        tuple(usage),
        presence,
        tuple(stage_start),
        moves if moving else NO_MOVES,
        host_peak(memory, moves, T) if moving else 0,
        tuple(int(held) for held in fetched_bytes) if graph.fetched else (),
        openings,
    )


def plan_cost(graph: Graph, R: np.ndarray) -> float:
    """The objective (1a), sum over t, i of R[t, i] c[t, i], where c[t, i] is node i's cost when t = i (its first
    run) and its recompute cost when t > i (a recomputation). R: [T, T], 0/1 or fractional (an LP's point).

    Written as every run at `cost` less what each recomputation saves, so a graph without recompute costs gets
    exactly `costs @ R.sum(axis=0)`."""
    runs = R.sum(axis=0)
    again = runs - np.diagonal(R)
    return float(graph.costs @ runs - (graph.costs - graph.recompute_costs) @ again)


def stage_compute(graph: Graph, R: np.ndarray) -> np.ndarray:
    """float64[T]: the compute of each stage, (1a) summed per stage t (`plan_cost` is their sum)."""
    T = graph.size
    prices = np.where(np.eye(T, dtype=bool), graph.costs[None, :], graph.recompute_costs[None, :])
    return (R.astype(np.float64) * prices).sum(axis=1)


def fetch_time(graph: Graph, R: np.ndarray, presence: np.ndarray) -> float:
    """The time of the fetches of the graph's fetched values that compute does not hide
    (`checkmate.fetched.exposed_fetch_times`)."""
    if not graph.fetched:
        return 0.0
    return float(exposed_fetch_times(graph.fetched, presence, stage_compute(graph, R), graph.fetch_overlap).sum())


def transfer_time(graph: Graph, R: np.ndarray, S: np.ndarray, moves: Moves) -> float:
    """The time the plan's moves to host memory add to its compute: the step's waits for copies
    (`checkmate.moved.transfer_schedule`)."""
    if not moves.any:
        return 0.0
    return float(exposed_transfer_times(graph.memory, graph.host_link, moves, S, stage_compute(graph, R)).sum())


def _last_consumer_in_stage(preds: tuple[tuple[int, ...], ...], computed: np.ndarray) -> dict[int, int]:
    last: dict[int, int] = {}
    for k in computed:
        for i in preds[k]:
            last[i] = int(k)
    return last


def simulate(graph: Graph, R: np.ndarray, S: np.ndarray) -> tuple[float, int]:
    """Return (cost, peak_memory) of the plan (R, S); raise InvalidSchedule if it breaks a constraint.

    cost is the paper's objective, sum(R[t, i] * cost[i]) with runs after a node's own stage at its recompute cost
    (`plan_cost`); peak_memory is in bytes and includes fixed_memory, what the nodes run so far retain, and the
    workspace of the node running at the peak.
    """
    schedule = lower(graph, R, S)
    return schedule.cost, schedule.peak_memory
