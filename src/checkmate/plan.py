"""Plans: the paper's 0/1 matrices R (compute) and S (hold), with their simulated figures."""

from __future__ import annotations

import heapq
import json
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Literal, cast

import numpy as np
import scipy.sparse as sp

from checkmate.graph import Graph
from checkmate.moved import NO_MOVES, Moves
from checkmate.simulate import Schedule, lower

# "optimal": a proven lower bound meets the plan's cost (within OPTIMALITY_TOLERANCE); "feasible": it fits, and its
# `gap` says how far from the best bound known it may be.
PlanStatus = Literal["optimal", "feasible"]
PLAN_STATUSES: tuple[PlanStatus, ...] = ("optimal", "feasible")
# The relative gap under which a plan counts as proven optimal: what solvers' own tolerances leave (a plan within a
# requested `mip_gap` of 1 % is "feasible", its gap shown).
OPTIMALITY_TOLERANCE = 1e-6


def proven_status(cost: float, bound: float | None) -> PlanStatus:
    """ "optimal" when the proven lower `bound` meets `cost` within OPTIMALITY_TOLERANCE, else "feasible"."""
    meets = bound is not None and cost <= bound + OPTIMALITY_TOLERANCE * abs(bound) + 1e-12
    return "optimal" if meets else "feasible"


def describe_status(status: PlanStatus, gap: float | None) -> str:
    """The status in words: "proven optimal", "within 0.87 % of the lower bound", or that no bound is known."""
    if status == "optimal":
        return "proven optimal"
    if gap is None:
        return "feasible, no lower bound known"
    return f"within {100 * gap:.2g} % of the lower bound"


@dataclass(frozen=True)
class Plan:
    """A rematerialization plan and what it costs.

    Attributes:
        R: bool[T, T]; R[t, i] = 1 when node i is (re)computed in stage t.
        S: bool[T, T]; S[t, i] = 1 when node i's output is held in memory from stage t - 1 into stage t.
        cost: total compute, sum of R[t, i] * cost[i] with runs after a node's own stage (t > i) at its recompute
            cost, as simulated (`checkmate.simulate.plan_cost`).
        peak_memory: bytes at the peak, fixed memory included, as simulated.
        method: the strategy that made the plan.
        solve_time: seconds the strategy took.
        budget: the budget in bytes the plan was made for, or None for no limit.
        status: "optimal" only when a proven lower bound meets its cost; otherwise "feasible" (`describe_status`).
        lower_bound: a proven lower bound on the cost of any plan within the budget, when known.
        gap: relative gap (cost - lower_bound) / cost, when a lower bound is known.
        presence: bool[T, F], the stages where each of the graph's fetched values is present (`checkmate.fetched`;
            F = 0 for a graph without them).
        moves: the copies of nodes' outputs to host memory and back (`checkmate.moved`; empty for none).
        host_peak: the most bytes the moves hold in host memory, as simulated.
    """

    R: np.ndarray
    S: np.ndarray
    cost: float
    peak_memory: int
    method: str
    solve_time: float = 0.0
    budget: int | None = None
    status: PlanStatus = "feasible"
    lower_bound: float | None = None
    gap: float | None = None
    presence: np.ndarray = field(default_factory=lambda: np.zeros((0, 0), dtype=bool), compare=False)
    moves: Moves = NO_MOVES
    host_peak: int = 0

    def describe(self) -> str:
        """The status in words (`describe_status`)."""
        return describe_status(self.status, self.gap)

    @property
    def recomputes(self) -> bool:
        """Whether the plan computes any node more than once."""
        return int(self.R.sum()) > self.R.shape[0]

    def to_json(self) -> str:
        """Serialise, with R and S as nested lists of 0/1."""
        return json.dumps(
            {
                "method": self.method,
                "cost": self.cost,
                "peak_memory": self.peak_memory,
                "budget": self.budget,
                "status": self.status,
                "lower_bound": self.lower_bound,
                "gap": self.gap,
                "solve_time": self.solve_time,
                "R": self.R.astype(int).tolist(),
                "S": self.S.astype(int).tolist(),
                **({"presence": self.presence.astype(int).tolist()} if self.presence.size else {}),
                **(
                    {
                        "copy_out": self.moves.copy_out.astype(int).tolist(),
                        "copy_in": self.moves.copy_in.astype(int).tolist(),
                        "buffered": self.moves.buffers(self.R.shape[0]).astype(int).tolist(),
                    }
                    if self.moves.any
                    else {}
                ),
            }
        )

    @classmethod
    def from_json(cls, text: str, graph: Graph) -> Plan:
        """Load a plan saved by `to_json`, re-simulating it on `graph` (raises InvalidSchedule if it no longer fits)."""
        data = json.loads(text)
        R = np.array(data["R"], dtype=bool).reshape(graph.size, graph.size)
        S = np.array(data["S"], dtype=bool).reshape(graph.size, graph.size)
        presence = data.get("presence")
        moves = NO_MOVES
        if "copy_out" in data or "copy_in" in data:
            moves = Moves(
                np.array(data.get("copy_out", np.zeros_like(R)), dtype=bool).reshape(graph.size, graph.size),
                np.array(data.get("copy_in", np.zeros_like(R)), dtype=bool).reshape(graph.size, graph.size),
                np.array(data["buffered"], dtype=bool).reshape(graph.size, graph.size)
                if "buffered" in data
                else np.zeros((0, 0), dtype=bool),
            )
        return make_plan(
            graph,
            R,
            S,
            presence=None if presence is None else np.array(presence, dtype=bool).reshape(graph.size, -1),
            moves=moves,
            method=data["method"],
            solve_time=data.get("solve_time", 0.0),
            budget=data.get("budget"),
            status=_stored_status(data),
            lower_bound=data.get("lower_bound"),
        )


def _stored_status(data: dict[str, object]) -> PlanStatus:
    """A stored plan's status, as strict as a new one's: files written before "optimal" meant a gap within
    OPTIMALITY_TOLERANCE (it meant within the solve's `mip_gap`) say "optimal" at a gap; those read "feasible"."""
    status = data.get("status", "feasible")
    if status not in PLAN_STATUSES:
        return "feasible"
    gap = data.get("gap")
    if status == "optimal" and isinstance(gap, (int, float)) and gap > OPTIMALITY_TOLERANCE:
        return "feasible"
    return cast(PlanStatus, status)


def make_plan(
    graph: Graph,
    R: np.ndarray,
    S: np.ndarray,
    *,
    method: str,
    solve_time: float = 0.0,
    budget: int | None = None,
    status: PlanStatus = "feasible",
    lower_bound: float | None = None,
    presence: np.ndarray | None = None,
    moves: Moves = NO_MOVES,
) -> Plan:
    """Simulate (R, S), the fetched values' `presence` (None: FSDP2's rule, `checkmate.fetched`) and the `moves` to
    host memory (`checkmate.moved`) on `graph` and wrap it as a Plan. Every strategy builds its plans through here."""
    schedule = lower(graph, R, S, presence, moves)
    gap = None
    if lower_bound is not None:
        gap = max(0.0, (schedule.cost - lower_bound) / schedule.cost) if schedule.cost > 0 else 0.0
    return Plan(
        R=R.astype(bool),
        S=S.astype(bool),
        cost=schedule.cost,
        peak_memory=schedule.peak_memory,
        method=method,
        solve_time=solve_time,
        budget=budget,
        status=status,
        lower_bound=lower_bound,
        gap=gap,
        presence=schedule.presence,
        moves=schedule.moves,
        host_peak=schedule.host_peak,
    )


def schedule_of(graph: Graph, plan: Plan) -> Schedule:
    """The steps that run `plan` on `graph`: its (R, S), its fetched values' presence and its moves, lowered."""
    return lower(graph, plan.R, plan.S, plan.presence, plan.moves)


def cheapest_fitting(plans: Iterable[Plan | None], budget: int | None) -> Plan | None:
    """The cheapest plan within `budget` bytes (None: no limit), ties broken by the lower peak; None when none fits.
    The one rule every search uses to pick its answer among candidates."""
    fitting = [plan for plan in plans if plan is not None and (budget is None or plan.peak_memory <= budget)]
    return min(fitting, key=lambda plan: (plan.cost, plan.peak_memory), default=None)


def cheapest_r(graph: Graph, S: np.ndarray) -> np.ndarray:
    """The cheapest R for a given S (paper Appendix B.1; Algorithm 2, steps 2-4).

    Args:
        graph: the training graph.
        S: bool[T, T], strictly lower triangular.

    Returns:
        bool[T, T]: the minimal R that makes (R, S) satisfy (1b), (1c) and (8a). It does not look at memory.
    """
    return cheapest_r_rows(graph, S.astype(bool), np.arange(graph.size))


def cheapest_r_rows(graph: Graph, S: np.ndarray, stages: np.ndarray) -> np.ndarray:
    """Rows `stages` of `cheapest_r(graph, S)` (bool[len(stages), T]): each stage depends only on S[t] and S[t+1]."""
    T = graph.size
    preds = graph.predecessors
    R = np.zeros((len(stages), T), dtype=bool)
    for row, t in zip(R, (int(stage) for stage in stages), strict=True):
        held = S[t]
        row[t] = True  # (8a)
        if t + 1 < T:
            row |= S[t + 1] & ~held  # (1c) S[t+1, i] <= R[t, i] + S[t, i]: compute v_i to materialise a checkpoint
        # (1b) R[t, j] <= R[t, i] + S[t, i] for (i, j) in E: visit the stage's computed nodes right to left
        # (a max-heap of indices), computing each missing input as a temporary.
        pending = [-int(v) for v in np.flatnonzero(row)]
        heapq.heapify(pending)
        while pending:
            v = -heapq.heappop(pending)
            for u in preds[v]:
                if not held[u] and not row[u]:
                    row[u] = True
                    heapq.heappush(pending, -u)
    return R


def prune_checkpoints(graph: Graph, R: np.ndarray, S: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Drop held values that no node of the stage reads and that are not held further, then take the cheapest R.

    Such a value only occupies memory until the stage ends (and may force a computation in the stage before), so
    dropping it never raises the cost or the peak. Repeats until nothing more can be dropped.

    Returns:
        (R, S), bool[T, T], valid when the input plan is.
    """
    S = S.astype(bool).copy()
    R = R.astype(bool)
    T = graph.size
    edges = graph.edges
    reads = sp.csr_array((np.ones(len(edges)), (edges[:, 1], edges[:, 0])), shape=(T, T))
    while True:
        read = (sp.csr_array(R.astype(np.float64)) @ reads).toarray() > 0
        changed = False
        held_later = np.zeros(T, dtype=bool)
        for t in range(T - 1, 0, -1):
            unused = S[t] & ~read[t] & ~held_later
            if unused.any():
                S[t] &= ~unused
                changed = True
            held_later = S[t]
        if not changed:
            return R, S
        R = cheapest_r(graph, S)
