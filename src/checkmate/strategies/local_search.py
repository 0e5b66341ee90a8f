"""Local search on a plan's checkpoints S, R always the cheapest for S: the moves and the incremental evaluator that
`approx` and `hold_more` share.

A state is a plan (R the cheapest for S, held values that nothing reads dropped) with its cost and the bytes in use
at every moment. Moves change S in a few stages:

* hold: keep a value the plan recomputes over a span of stages instead, from where it was last available through
  its recomputation (a "bridge"), or from its first computation through a later recomputation (removing every
  recomputation in between);
* drop: stop holding a run of a value over a stage that is over the budget (whole, or its part up to or from that
  stage).

On these, `repair` lowers a plan's excess over the budget until it fits, and `improve` descends to a plan no single
hold makes cheaper. Moves are screened with a vectorised copy of the simulator's accounting, recomputed only for the
stages a move touches (`LocalSearch.derive`); `state_plan` turns a state into a `Plan` through the simulator, which
must agree.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

import numpy as np

from checkmate.fetched import default_presence, fetching_bytes, present_bytes
from checkmate.graph import Graph
from checkmate.plan import Plan, cheapest_r, cheapest_r_rows, make_plan
from checkmate.progress import SearchControl
from checkmate.simulate import fetch_time, plan_cost
from checkmate.strategies.policy import POLICY, SearchPolicy

# Over-budget holds tried with a repair after them, per improvement step (cheapest first).
COMPOUND_MOVES = 16
# When no drop lowers the excess, the drops (least excess first) that a hold may follow.
LOOKAHEAD_DROPS = 8

# A hold: (node, first stage, last stage) holds node over those stages.
Move = tuple[int, int, int]


class SearchState:
    """A plan (R the cheapest for S, unused checkpoints dropped) with its cost, usage and excess over the budget.

    `read[t, i]` is whether stage t computes a node that reads i; `usage` is `LocalSearch.usage` of (R, S);
    `present` [2, T]: per stage, the bytes of the graph's fetched values present (FSDP2's rule for R,
    `checkmate.fetched.default_presence`) and those their fetches hold at its start.
    """

    __slots__ = ("R", "S", "cost", "excess", "key", "peak", "present", "read", "usage")

    def __init__(
        self,
        R: np.ndarray,
        S: np.ndarray,
        read: np.ndarray,
        usage: np.ndarray,
        present: np.ndarray,
        cost: float,
        budget: int,
    ):
        self.R, self.S, self.read, self.usage, self.present, self.cost = R, S, read, usage, present, cost
        self.peak = int(usage.max())
        self.excess = int(np.maximum(usage - budget, 0).sum())  # bytes over the budget, summed over moments
        self.key = S.tobytes()

    @property
    def stage_peaks(self) -> np.ndarray:
        """int64[T]: the highest usage of each stage."""
        return self.usage.max(axis=1)


class LocalSearch:
    """Evaluate, repair and improve S by moves (see the module doc) within `budget`, on `control`'s clock."""

    def __init__(self, graph: Graph, budget: int, control: SearchControl, policy: SearchPolicy = POLICY) -> None:
        T = graph.size
        self.graph, self.budget, self.control, self.policy, self.T = graph, budget, control, policy, T
        self.evaluations = 0
        self.on_better: Callable[[SearchState], None] | None = None  # told of every plan `improve` moves to
        self.recompute_costs = graph.recompute_costs  # what a move saves or adds: runs after a node's own stage
        self.memory = graph.memory.astype(np.int64)
        edges = graph.edges
        order = np.argsort(edges[:, 0], kind="stable")
        self.src, self.dst = edges[order, 0], edges[order, 1]
        self.sources, self.starts = np.unique(self.src, return_index=True)
        transient = np.broadcast_to(graph.recompute_workspace, (T, T)).copy()
        transient[np.diag_indices(T)] = graph.workspace + graph.retained  # a first run: its workspace, what it keeps
        self.transient = transient + graph.held_before_stage[:, None]
        # a stage's start with what it holds only then (`Graph.opening_held`), counted at its first computation
        self.opening = graph.held_before_stage + graph.held_at_opening
        self.stages = np.arange(T)[:, None]
        self.eye = np.eye(T, dtype=bool)

    # evaluation

    def state(self, S: np.ndarray) -> SearchState:
        """The plan of S: the cheapest R, unused checkpoints dropped, with the simulated cost and usage."""
        S = np.tril(S.astype(bool), k=-1)
        rows = np.arange(self.T)
        R = self._cheapest_rows(S, rows)
        read = self._read(R, rows)
        return self._settle(R, S, read, np.zeros((self.T, self.T), dtype=np.int64), rows, None)

    def derive(self, parent: SearchState, S: np.ndarray) -> SearchState:
        """The plan of S, a copy of parent.S changed in a few stages (R etc. recomputed only there)."""
        changed = np.flatnonzero((S != parent.S).any(axis=1))
        rows = _with_previous(changed)
        R = parent.R.copy()
        R[rows] = self._cheapest_rows(S, rows)
        read = parent.read.copy()
        read[rows] = self._read(R, rows)
        return self._settle(R, S, read, parent.usage.copy(), rows, parent.present)

    def state_plan(self, state: SearchState, *, method: str) -> Plan:
        """The state as a Plan, built by the simulator (which must agree with this search's accounting)."""
        plan = make_plan(self.graph, cheapest_r(self.graph, state.S), state.S, method=method)
        assert plan.peak_memory == state.peak and abs(plan.cost - state.cost) <= self.policy.solver_tolerance * max(
            1.0, state.cost
        ), "the search's simulator must agree with make_plan"
        return plan

    def _settle(
        self,
        R: np.ndarray,
        S: np.ndarray,
        read: np.ndarray,
        usage: np.ndarray,
        rows: np.ndarray,
        present_before: np.ndarray | None,
    ) -> SearchState:
        """Drop held values that no later stage of their run reads (they cost memory and save nothing), then
        update the usage of every stage whose R or S changed (`rows` so far) or whose fetched values did (against
        `present_before`, None: every stage)."""
        self.evaluations += 1
        touched = np.zeros(self.T, dtype=bool)
        touched[rows] = True
        while True:
            next_read = np.minimum.accumulate(np.where(S & read, self.stages, self.T)[::-1], axis=0)[::-1]
            next_gap = np.minimum.accumulate(np.where(S, self.T, self.stages)[::-1], axis=0)[::-1]
            keep = S & (next_read < next_gap)
            changed = np.flatnonzero((keep != S).any(axis=1))
            if changed.size == 0:
                break
            S = keep
            rows = _with_previous(changed)
            R[rows] = self._cheapest_rows(S, rows)
            read[rows] = self._read(R, rows)
            touched[rows] = True
        presence = default_presence(self.graph.fetched, R)
        present = np.stack(
            [
                present_bytes(self.graph.fetched, presence, self.graph.prefetch),
                fetching_bytes(self.graph.fetched, presence),
            ]
        )
        touched |= True if present_before is None else (present != present_before).any(axis=0)
        rows = np.flatnonzero(touched)
        usage[rows] = self.usage(R, S, rows, present)
        cost = plan_cost(self.graph, R) + fetch_time(self.graph, R, presence)
        return SearchState(R, S, read, usage, present, cost, self.budget)

    def _read(self, R: np.ndarray, rows: np.ndarray) -> np.ndarray:
        """bool[len(rows), T]: whether stage t (in `rows`) computes a node that reads node i."""
        read = np.zeros((rows.size, self.T), dtype=bool)
        if self.src.size:  # no BLAS: a threaded matrix product stalls on a busy machine
            read[:, self.sources] = np.logical_or.reduceat(R[rows][:, self.dst], self.starts, axis=1)
        return read

    def _cheapest_rows(self, S: np.ndarray, rows: np.ndarray) -> np.ndarray:
        """Rows `rows` of `checkmate.plan.cheapest_r(graph, S)`."""
        return cheapest_r_rows(self.graph, S, rows)

    def usage(self, R: np.ndarray, S: np.ndarray, rows: np.ndarray, present: np.ndarray) -> np.ndarray:
        """int64[len(rows), T]: bytes in use just after stage t computes node k, as `simulate` counts them (fixed
        memory, workspace and the `present[0]` bytes of fetched values in), for t in `rows`; -1 where R[t, k] = 0. The
        first computation of a stage counts at least its start with what is held only then (`Graph.opening_held`,
        and `present[1]`, its fetches' workspaces).

        Within stage t the live bytes are those held into it, plus what the stage has computed so far, minus the
        inputs freed after their last reader in the stage (when not held into stage t + 1).
        """
        T, memory = self.T, self.memory
        R_rows = R[rows]
        usage = (S[rows].astype(np.int64) @ memory)[:, None] + np.cumsum(np.where(R_rows, memory, 0), axis=1)
        usage += self.transient[rows] + present[0, rows][:, None]
        if self.src.size:
            last = np.maximum.reduceat(np.where(R_rows[:, self.dst], self.dst, -1), self.starts, axis=1)
            held_next = np.zeros((rows.size, self.sources.size), dtype=bool)
            inner = rows + 1 < T
            held_next[inner] = S[rows[inner] + 1][:, self.sources]
            stage, column = np.nonzero((last >= 0) & ~held_next)
            freed = np.bincount(
                stage * T + last[stage, column], weights=memory[self.sources[column]], minlength=rows.size * T
            ).reshape(rows.size, T)
            usage -= (np.cumsum(freed, axis=1) - freed).astype(np.int64)
        if self.graph.opening_held or present[1].any():  # the simulator's `Schedule.openings`
            start = S[rows].astype(np.int64) @ memory + self.opening[rows] + present[0, rows] + present[1, rows]
            first = np.argmax(R_rows, axis=1)
            usage[np.arange(rows.size), first] = np.maximum(usage[np.arange(rows.size), first], start)
        return np.where(R_rows, usage, -1)

    # moves

    def holds(
        self, state: SearchState, *, from_first_computation: bool = False, over_budget_only: bool = False
    ) -> list[Move]:
        """Spans over which to hold a value the plan recomputes, most recomputation cost saved per byte per stage
        held first: a bridge from where the value was last available through each recomputation, and (if
        `from_first_computation`) a span from its first computation through each later recomputation. With
        `over_budget_only`, only recomputations in over-budget stages."""
        available = state.R | state.S
        recomputed = state.R & ~self.eye
        if over_budget_only:
            recomputed &= (state.stage_peaks > self.budget)[:, None]
        moves: list[tuple[float, Move]] = []
        for stage, node in zip(*np.nonzero(recomputed), strict=True):
            size = max(int(self.memory[node]), 1)
            since = int(np.flatnonzero(available[:stage, node])[-1])
            saved = float(self.recompute_costs[node])
            moves.append((-saved / (size * int(stage - since)), (int(node), since + 1, int(stage))))
            if from_first_computation:
                computed = np.flatnonzero(state.R[:stage, node])
                if computed.size > 1:  # recomputed before `stage` too: holding from the first run saves them all
                    first = int(computed[0])
                    saved = float(self.recompute_costs[node]) * computed.size
                    moves.append((-saved / (size * int(stage - first)), (int(node), first + 1, int(stage))))
        moves.sort()
        return [move for _, move in moves]

    @staticmethod
    def held(state: SearchState, move: Move) -> np.ndarray:
        """S of `state` with the move's value held over its span."""
        node, first, last = move
        S = state.S.copy()
        S[first : last + 1, node] = True
        return S

    def _drops(self, state: SearchState) -> Iterator[np.ndarray]:
        """S with one held run over an over-budget stage dropped: whole, up to that stage, or from it on."""
        over = np.flatnonzero(state.stage_peaks > self.budget)
        for node in np.flatnonzero(state.S[over].any(axis=0)):
            seen: set[tuple[int, int]] = set()
            for first, last in _runs(state.S[:, node]):
                inside = over[(over >= first) & (over <= last)]
                if inside.size == 0:
                    continue
                for span in ((first, last), (first, int(inside[-1])), (int(inside[0]), last)):
                    if span not in seen:
                        seen.add(span)
                        S = state.S.copy()
                        S[span[0] : span[1] + 1, node] = False
                        yield S

    # search

    def run(self, state: SearchState, *, bridges: bool = True) -> SearchState | None:
        """Repair `state` into the budget (None if that fails), then improve it until no move helps."""
        repaired = self.repair(state, bridges=bridges)
        return None if repaired is None else self.improve(repaired)

    def repair(self, state: SearchState, *, bridges: bool = True) -> SearchState | None:
        """Lower the excess over the budget move by move until there is none (None if no move lowers it).

        The moves: drop a held run over an over-budget stage, or (if `bridges`) hold a value recomputed in one (a
        cheap held value can replace a long recomputation and its inputs). The move taken is the cheapest one that
        fits, else the one that removes excess at the least cost per byte-moment. When none lowers the excess, a
        drop followed by a hold may; the best such pair is taken.
        """
        while state.excess > 0:
            moves = list(self._drops(state))
            if bridges:
                moves += [self.held(state, move) for move in self.holds(state, over_budget_only=True)]
            candidates = []
            for S in moves:
                if self.control.stopped:
                    return None
                candidates.append(self.derive(state, S))
            chosen = self._least_excess_per_cost(state, candidates)
            if chosen is None:
                pairs = []
                for dropped in sorted(candidates, key=lambda s: (s.excess, s.cost))[:LOOKAHEAD_DROPS]:
                    for move in self.holds(dropped, over_budget_only=True):
                        if self.control.stopped:
                            return None
                        pairs.append(self.derive(dropped, self.held(dropped, move)))
                chosen = self._least_excess_per_cost(state, pairs)
            if chosen is None:
                return None
            state = chosen
        return state

    def _least_excess_per_cost(self, state: SearchState, candidates: list[SearchState]) -> SearchState | None:
        """The cheapest candidate within the budget, else the one that removes excess at the least cost per byte."""
        within = [c for c in candidates if c.excess == 0]
        if within:
            return min(within, key=lambda c: (c.cost, c.peak))
        better = [c for c in candidates if c.excess < state.excess]
        if not better:
            return None
        tolerance = self.policy.cost_tolerance
        return min(better, key=lambda c: (c.cost - state.cost + tolerance) / (state.excess - c.excess))

    def improve(self, state: SearchState) -> SearchState:
        """Descent: the cheapest bridge within the budget; when none fits, a bridge then a repair, if cheaper.

        A move's effect (cost change, fit, the stages it touches) is remembered until a taken move touches the
        same stages (or the ones next to them); the move chosen is evaluated afresh before it is taken.
        """
        policy = self.policy
        known: dict[Move, tuple[float, bool, np.ndarray]] = {}
        failed: dict[Move, np.ndarray] = {}  # over-budget moves whose repair did not pay, with their stages
        while not self.control.stopped:
            moves = self.holds(state)
            fresh: dict[Move, SearchState] = {}
            for move in moves:
                if move in known:
                    continue
                if self.control.stopped:
                    return state
                candidate = fresh[move] = self.derive(state, self.held(state, move))
                known[move] = (candidate.cost - state.cost, candidate.excess == 0, self._touched(state, candidate))
            ranked = sorted(moves, key=lambda move: known[move][0])
            chosen: SearchState | None = None
            for move in ranked:
                delta, fits, _ = known[move]
                if delta >= -policy.cost_tolerance:
                    break
                if fits:
                    candidate = fresh.get(move) or self.derive(state, self.held(state, move))
                    if candidate.excess == 0 and policy.cheaper(candidate.cost, state.cost):
                        chosen = candidate
                        break
                    known[move] = (candidate.cost - state.cost, candidate.excess == 0, self._touched(state, candidate))
            if chosen is None:
                tried = 0
                for move in ranked:
                    delta, fits, touched = known[move]
                    if delta >= -policy.cost_tolerance or tried >= COMPOUND_MOVES:
                        break
                    if fits or move in failed:
                        continue
                    tried += 1
                    candidate = fresh.get(move) or self.derive(state, self.held(state, move))
                    repaired = self.repair(candidate)
                    if repaired is not None and policy.cheaper(repaired.cost, state.cost):
                        chosen = repaired
                        break
                    failed[move] = touched
            if chosen is None:
                return state
            if self.on_better is not None:
                self.on_better(chosen)
            changed = self._touched(state, chosen)
            near = changed.copy()
            near[1:] |= changed[:-1]
            near[:-1] |= changed[1:]
            for move in [move for move, (_, _, stages) in known.items() if (stages & near).any()]:
                del known[move]
            for move in [move for move, stages in failed.items() if (stages & near).any()]:
                del failed[move]
            state = chosen
        return state

    @staticmethod
    def _touched(before: SearchState, after: SearchState) -> np.ndarray:
        """bool[T]: the stages whose R, S or usage differ."""
        return ((before.R != after.R) | (before.S != after.S) | (before.usage != after.usage)).any(axis=1)


def _with_previous(stages: np.ndarray) -> np.ndarray:
    """The stages and the ones just before them (R[t] depends on S[t] and S[t + 1]), sorted, without -1."""
    return np.union1d(stages, stages[stages > 0] - 1)


def _runs(column: np.ndarray) -> list[tuple[int, int]]:
    """The maximal runs [first, last] (inclusive) of True in a bool vector."""
    steps = np.diff(np.concatenate([[0], column.astype(np.int8), [0]]))
    return list(zip(np.flatnonzero(steps == 1).tolist(), (np.flatnonzero(steps == -1) - 1).tolist(), strict=True))
