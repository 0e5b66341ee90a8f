"""approx: the paper's two-phase LP rounding (section 5, Algorithm 2), searching the budget allowance ε, with a
local search that repairs and improves the rounded checkpoints.

For each ε the LP relaxation is solved at (1 - ε) of the activation budget (ε = 0 is the LP of the lower bound);
only S is rounded (a deterministic threshold sweep, seeded randomized rounding S ~ Bernoulli(S*), and seeded
rounding with one uniform threshold per node, which keeps a node's checkpoints consistent across stages); R is the
cheapest for that S (App. B.1). The paper fixes ε = 0.1 and names a search over ε as future work.

Rounding alone lands up to 2x above the optimum on small chains (the rounded checkpoints are each plausible but do
not fit together; benchmarks/approx_quality.py) and near the smallest feasible budget often finds no plan at all.
So the best roundings of each ε, within the budget or not, are improved by a local search on S, R always the
cheapest for S and held values that nothing reads dropped:

* repair, while the plan is over budget: drop a held run of a value over an over-budget stage (whole, or its part
  up to or from that stage), or hold a value that such a stage recomputes; the move that fits at the least cost,
  else the one that removes excess (bytes over the budget, summed over moments) at the least cost per byte;
* improve: hold a recomputed value from where it was last available through its recomputation (a "bridge"); the
  cheapest bridge that fits, and when none does, a bridge followed by a repair that ends cheaper.

Moves are screened with a vectorised copy of the simulator's accounting, recomputed only for the stages a move
touches; the plan returned is built by `make_plan`, so its cost and peak are the simulator's. The whole call
shares one clock (`time_limit`, or the caller's `SearchControl`): the LP of the bound gets most of the time left,
each other LP what is left, the search stops when the time is up, and the best plan so far is returned.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator, Sequence
from typing import NamedTuple

import numpy as np

from checkmate.bounds import activation_floor
from checkmate.graph import Graph
from checkmate.milp.backends import get_backend
from checkmate.milp.formulation import decode_fractional, encode
from checkmate.milp.problem import SolveOptions, SolveStatus
from checkmate.milp.scaling import DEFAULT_RESOLUTION, MemoryScale, memory_scale, relaxed_scale
from checkmate.plan import Plan, cheapest_r, cheapest_r_rows, make_plan
from checkmate.progress import ProgressCallback, SearchControl
from checkmate.strategies.checkpoint_all import checkpoint_all
from checkmate.strategies.common import EXACT_NODES, infeasible
from checkmate.strategies.feasibility import infeasible_budget, message_time
from checkmate.strategies.registry import register

log = logging.getLogger(__name__)

METHOD = "approx"
EPSILONS = (0.0, 0.1, 0.3)
THRESHOLDS = (0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9)
# Share of the time left that the first LP (the lower bound, also rounded at ε = 0) may take: the LPs at the
# other ε are as large, so one that does not finish in time is not helped by leaving them more.
BOUND_SHARE = 0.8
# Over-budget bridges tried with a repair after them, per improvement step (cheapest first).
COMPOUND_MOVES = 16
# When no drop lowers the excess, the drops (least excess first) that a bridge may follow.
LOOKAHEAD_DROPS = 8

# A bridge: (node, first stage, last stage) holds node over those stages.
Move = tuple[int, int, int]


@register(METHOD, "LP relaxation + two-phase rounding of S (paper section 5), searching ε, with a local-search repair")
def approx(
    graph: Graph,
    budget: int | None,
    *,
    epsilons: Sequence[float] = EPSILONS,
    thresholds: Sequence[float] = THRESHOLDS,
    samples: int = 16,
    seed: int = 0,
    starts: int = 2,
    improve: bool = True,
    time_limit: float | None = None,
    memory_resolution: int = DEFAULT_RESOLUTION,
    progress: ProgressCallback | None = None,
    control: SearchControl | None = None,
    exact_nodes: int = EXACT_NODES,
    coarse_nodes: int | None = None,
) -> Plan:
    """Round LP relaxations, improve the best roundings by local search, and return the cheapest plan found.

    Graphs of more than `exact_nodes` nodes are rounded on a coarse graph of `coarse_nodes` blocks instead
    (`checkmate.strategies.coarsened.coarsened_approx`), whose plan is expanded and improved on the full graph.

    Args:
        graph: the training graph.
        budget: bytes, fixed memory included; None means no limit (then checkpoint_all is optimal).
        epsilons: budget allowances to try: the LP is solved at (1 - ε) of the activation budget.
        thresholds: deterministic rounding thresholds: S = [S* >= threshold].
        samples: randomized roundings of each kind per ε (seeded by `seed`).
        seed: seeds the randomized roundings.
        starts: local searches per ε: from the cheapest rounding within the budget, then from the roundings
            over it (repaired first), least excess first.
        improve: False gives the paper's rounding alone, unused checkpoints dropped (no local search; at tight
            budgets often no plan).
        time_limit: seconds for the whole call; when they run out, the best plan found so far.
        memory_resolution: at most this many memory units for the largest node (see checkmate.milp.scaling).
        progress: called with a `checkmate.progress.Progress` whenever the best plan or the bound improves.
        control: the clock and stop flag of a caller that already has one (then time_limit and progress are its).

    Returns:
        The cheapest plan found within the budget, with the LP bound at the full budget as `lower_bound`.

    Raises:
        InfeasibleBudget: below the activation floor, or when the LP proves that no schedule fits, or when no
            plan was found (in the time limit).
    """
    control = control if control is not None else SearchControl(time_limit=time_limit, callback=progress)
    if budget is None:
        plan = checkpoint_all(graph, None)
        return make_plan(graph, plan.R, plan.S, method=METHOD, status="optimal", lower_bound=plan.cost)
    if budget < activation_floor(graph):
        raise infeasible_budget(graph, budget, method=METHOD, time_limit=message_time(control))
    if graph.size > exact_nodes:
        from checkmate.strategies.coarsened import coarsened_approx

        return coarsened_approx(graph, budget, control, blocks=coarse_nodes, method=METHOD, seed=seed)
    search = _LocalSearch(graph, budget, control)
    bound, bound_S = _lower_bound(graph, budget, control)
    control.report("approx: LP bound", bound=bound)
    scale = memory_scale(graph, memory_resolution)
    rng = np.random.default_rng(seed)
    seen: set[bytes] = set()  # the rounded S evaluated
    pool: dict[bytes, _Rounding] = {}  # their plans, by the bytes of S with unused checkpoints dropped
    tried: set[bytes] = set()  # the keys of pool that a local search started from
    best: _State | None = None

    def consider(state: _State | None) -> None:
        nonlocal best
        if state is None or state.excess > 0 or (best is not None and state.cost >= best.cost - 1e-9):
            return
        best = state
        control.report("approx", cost=best.cost, bound=bound)

    search.on_better = consider
    start = search.state(checkpoint_all(graph, None).S)  # the rounding of the LP without a budget: hold everything
    pool[start.key] = _Rounding(start.S, start.cost, start.excess)
    consider(start)
    for epsilon in epsilons:
        if control.stopped or (best is not None and best.cost <= bound + 1e-9):
            break
        S_fractional = bound_S if epsilon == 0 else _relaxation(graph, budget, epsilon, scale, control)
        if S_fractional is None:
            continue
        for S in _roundings(graph, S_fractional, thresholds, samples, rng):
            if control.stopped:
                break
            if S.tobytes() not in seen:
                seen.add(S.tobytes())
                state = search.state(S)
                pool.setdefault(state.key, _Rounding(state.S, state.cost, state.excess))
                consider(state)
        if improve:
            for rounding in _starts(pool, tried, starts):
                if control.stopped or (best is not None and best.cost <= bound + 1e-9):
                    break
                consider(search.run(search.state(rounding.S)))
    if improve and not control.stopped and best is None:
        for rounding in _starts(pool, tried, len(pool)):  # nothing fits yet: repair every rounding, best first
            for bridges in (True, False):  # without bridges the repair's choices differ, and sometimes fit
                if control.stopped or best is not None:
                    break
                consider(search.run(search.state(rounding.S), bridges=bridges))
    if best is None:
        if control.interrupted:
            reason = "stopped (interrupted) before a plan was found"
        elif control.stopped:
            reason = f"the time limit ({control.time_limit:g} s) was reached before a plan was found"
        else:
            reason = "no plan found"
        raise infeasible(METHOD, budget, None, hint=f"{reason}; try method='optimal' or a larger budget")
    plan = make_plan(graph, cheapest_r(graph, best.S), best.S, method=METHOD)
    assert plan.peak_memory <= budget and abs(plan.cost - best.cost) <= 1e-6 * max(1.0, best.cost), (
        "the search's simulator must agree with make_plan"
    )
    proven = plan.cost <= bound + 1e-9
    log.info("approx: cost %.6g, bound %.6g, %d plans evaluated", plan.cost, bound, search.evaluations)
    return make_plan(
        graph,
        plan.R,
        plan.S,
        method=METHOD,
        solve_time=control.elapsed,
        budget=budget,
        status="optimal" if proven else "feasible",
        lower_bound=min(bound, plan.cost),
    )


def _lower_bound(graph: Graph, budget: int, control: SearchControl) -> tuple[float, np.ndarray | None]:
    """`checkmate.lower_bound` (the LP at the full budget, sizes rounded down) and its S* for rounding.

    The LP gets BOUND_SHARE of the time left; when it does not finish, the bound is the trivial one (every node
    once) and S* whatever point the solver had, if any.
    """
    scale = relaxed_scale(memory_scale(graph), graph)
    problem, index = encode(graph, scale.budget_units(budget, graph.fixed_memory), scale)
    options = SolveOptions(time_limit=control.share(BOUND_SHARE), should_stop=lambda: control.stopped)
    solution = get_backend("highs").solve(problem.relaxed(), options)
    if solution.status is SolveStatus.INFEASIBLE:
        raise infeasible_budget(graph, budget, method=METHOD, time_limit=message_time(control))
    S_fractional = None if solution.x is None else decode_fractional(solution.x, index)[1]
    trivial = float(graph.costs.sum())
    if solution.status is not SolveStatus.OPTIMAL or solution.objective is None:
        log.info("approx: the LP bound did not finish; using the trivial bound (each node once)")
        return trivial, S_fractional
    return max(trivial, solution.objective), S_fractional


def _relaxation(
    graph: Graph, budget: int, epsilon: float, scale: MemoryScale, control: SearchControl
) -> np.ndarray | None:
    """S* of the LP relaxation at (1 - epsilon) of the activation budget (None when the LP gives no point)."""
    activation = (1.0 - epsilon) * (budget - graph.fixed_memory)
    problem, index = encode(
        graph, float(scale.budget_units(int(activation) + graph.fixed_memory, graph.fixed_memory)), scale
    )
    options = SolveOptions(time_limit=control.remaining(), should_stop=lambda: control.stopped)
    solution = get_backend("highs").solve(problem.relaxed(), options)
    if solution.x is None:
        log.info("approx: the LP at ε = %g has no solution (%s)", epsilon, solution.status.value)
        return None
    return decode_fractional(solution.x, index)[1]


def _roundings(
    graph: Graph, S_fractional: np.ndarray, thresholds: Sequence[float], samples: int, rng: np.random.Generator
) -> Iterator[np.ndarray]:
    """The rounded S matrices of one LP solution S*."""
    for threshold in thresholds:
        yield S_fractional >= threshold - 1e-9
    for _ in range(samples):
        yield rng.random(S_fractional.shape) < S_fractional  # Appendix D: S ~ Bernoulli(S*)
    for _ in range(samples):
        yield S_fractional >= rng.random(graph.size)[None, :]  # one threshold per node: its checkpoints stay in step


class _Rounding(NamedTuple):
    """A rounded S (unused checkpoints dropped) with its plan's cost and excess over the budget."""

    S: np.ndarray
    cost: float
    excess: int


def _starts(pool: dict[bytes, _Rounding], tried: set[bytes], count: int) -> list[_Rounding]:
    """Up to `count` untried starting points: the cheapest plan within the budget, then the plans over it, least
    excess first (closest to fitting: repairing the cheapest ones, which hold nearly everything, ends alike)."""
    fresh = [rounding for key, rounding in pool.items() if key not in tried]
    within = sorted((s for s in fresh if s.excess == 0), key=lambda s: s.cost)
    over = sorted((s for s in fresh if s.excess > 0), key=lambda s: (s.excess, s.cost))
    chosen = (within[:1] + over + within[1:])[:count]
    tried.update(rounding.S.tobytes() for rounding in chosen)
    return chosen


class _State:
    """A plan (R the cheapest for S, unused checkpoints dropped) with its cost, usage and excess over the budget.

    `read[t, i]` is whether stage t computes a node that reads i; `usage` is `_LocalSearch._usage` of (R, S).
    """

    __slots__ = ("R", "S", "cost", "excess", "key", "peak", "read", "usage")

    def __init__(self, R: np.ndarray, S: np.ndarray, read: np.ndarray, usage: np.ndarray, cost: float, budget: int):
        self.R, self.S, self.read, self.usage, self.cost = R, S, read, usage, cost
        self.peak = int(usage.max())
        self.excess = int(np.maximum(usage - budget, 0).sum())  # bytes over the budget, summed over moments
        self.key = S.tobytes()


class _LocalSearch:
    """Repair and improve S by moves on held runs, screening each with a vectorised simulator (see module doc).

    A move changes S in a few stages; R, `read` and the usage are recomputed only for the stages it touches.
    """

    def __init__(self, graph: Graph, budget: int, control: SearchControl) -> None:
        T = graph.size
        self.graph, self.budget, self.control, self.T = graph, budget, control, T
        self.evaluations = 0
        self.on_better: Callable[[_State], None] | None = None  # told of every plan the search moves to
        self.costs = graph.costs
        self.memory = graph.memory.astype(np.int64)
        edges = graph.edges
        order = np.argsort(edges[:, 0], kind="stable")
        self.src, self.dst = edges[order, 0], edges[order, 1]
        self.sources, self.starts = np.unique(self.src, return_index=True)
        transient = np.broadcast_to(graph.recompute_workspace, (T, T)).copy()
        transient[np.diag_indices(T)] = graph.workspace + graph.retained  # a first run: its workspace, what it keeps
        self.transient = transient + graph.held_before_stage[:, None]
        self.stages = np.arange(T)[:, None]
        self.eye = np.eye(T, dtype=bool)

    # evaluation

    def state(self, S: np.ndarray) -> _State:
        """The plan of S: the cheapest R, unused checkpoints dropped, with the simulated cost and usage."""
        S = np.tril(S.astype(bool), k=-1)
        rows = np.arange(self.T)
        R = self._cheapest_rows(S, rows)
        read = self._read(R, rows)
        return self._settle(R, S, read, np.zeros((self.T, self.T), dtype=np.int64), rows)

    def derive(self, parent: _State, S: np.ndarray) -> _State:
        """The plan of S, a copy of parent.S changed in a few stages (R etc. recomputed only there)."""
        changed = np.flatnonzero((S != parent.S).any(axis=1))
        rows = _with_previous(changed)
        R = parent.R.copy()
        R[rows] = self._cheapest_rows(S, rows)
        read = parent.read.copy()
        read[rows] = self._read(R, rows)
        return self._settle(R, S, read, parent.usage.copy(), rows)

    def _settle(self, R: np.ndarray, S: np.ndarray, read: np.ndarray, usage: np.ndarray, rows: np.ndarray) -> _State:
        """Drop held values that no later stage of their run reads (they cost memory and save nothing), then
        update the usage of every stage whose R or S changed (`rows` so far)."""
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
        rows = np.flatnonzero(touched)
        usage[rows] = self._usage(R, S, rows)
        return _State(R, S, read, usage, float(self.costs @ R.sum(axis=0)), self.budget)

    def _read(self, R: np.ndarray, rows: np.ndarray) -> np.ndarray:
        """bool[len(rows), T]: whether stage t (in `rows`) computes a node that reads node i."""
        read = np.zeros((rows.size, self.T), dtype=bool)
        if self.src.size:  # no BLAS: a threaded matrix product stalls on a busy machine
            read[:, self.sources] = np.logical_or.reduceat(R[rows][:, self.dst], self.starts, axis=1)
        return read

    def _cheapest_rows(self, S: np.ndarray, rows: np.ndarray) -> np.ndarray:
        """Rows `rows` of `checkmate.plan.cheapest_r(graph, S)`."""
        return cheapest_r_rows(self.graph, S, rows)

    def _usage(self, R: np.ndarray, S: np.ndarray, rows: np.ndarray) -> np.ndarray:
        """int64[len(rows), T]: bytes in use just after stage t computes node k, as `simulate` counts them (fixed
        memory and workspace in), for t in `rows`; -1 where R[t, k] = 0.

        Within stage t the live bytes are those held into it, plus what the stage has computed so far, minus the
        inputs freed after their last reader in the stage (when not held into stage t + 1).
        """
        T, memory = self.T, self.memory
        R_rows = R[rows]
        usage = (S[rows].astype(np.int64) @ memory)[:, None] + np.cumsum(np.where(R_rows, memory, 0), axis=1)
        usage += self.transient[rows]
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
        return np.where(R_rows, usage, -1)

    # search

    def run(self, state: _State, *, bridges: bool = True) -> _State | None:
        """Repair `state` into the budget (None if that fails), then improve it until no move helps."""
        repaired = self._repair(state, bridges=bridges)
        return None if repaired is None else self._improve(repaired)

    def _repair(self, state: _State, *, bridges: bool = True) -> _State | None:
        """Lower the excess over the budget move by move until there is none (None if no move lowers it).

        The moves: drop a held run over an over-budget stage, or (if `bridges`) hold a value recomputed in one (a
        bridge: a cheap held value can replace a long recomputation and its inputs). The move taken is the cheapest one
        that fits, else the one that removes excess at the least cost per byte-moment. When none lowers the
        excess, a drop followed by a bridge may; the best such pair is taken.
        """
        while state.excess > 0:
            moves = list(self._drops(state))
            if bridges:
                moves += [S for _, S in self._bridges(state, over_budget_only=True)]
            candidates = []
            for S in moves:
                if self.control.stopped:
                    return None
                candidates.append(self.derive(state, S))
            chosen = self._least_excess_per_cost(state, candidates)
            if chosen is None:
                pairs = []
                for dropped in sorted(candidates, key=lambda s: (s.excess, s.cost))[:LOOKAHEAD_DROPS]:
                    for _, S in self._bridges(dropped, over_budget_only=True):
                        if self.control.stopped:
                            return None
                        pairs.append(self.derive(dropped, S))
                chosen = self._least_excess_per_cost(state, pairs)
            if chosen is None:
                return None
            state = chosen
        return state

    @staticmethod
    def _least_excess_per_cost(state: _State, candidates: list[_State]) -> _State | None:
        """The cheapest candidate within the budget, else the one that removes excess at the least cost per byte."""
        within = [c for c in candidates if c.excess == 0]
        if within:
            return min(within, key=lambda c: (c.cost, c.peak))
        better = [c for c in candidates if c.excess < state.excess]
        if not better:
            return None
        return min(better, key=lambda c: (c.cost - state.cost + 1e-9) / (state.excess - c.excess))

    def _drops(self, state: _State) -> Iterator[np.ndarray]:
        """S with one held run over an over-budget stage dropped: whole, up to that stage, or from it on."""
        over = np.flatnonzero(state.usage.max(axis=1) > self.budget)
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

    def _bridges(self, state: _State, *, over_budget_only: bool = False) -> list[tuple[Move, np.ndarray]]:
        """S holding a recomputed value from where it was last available through its recomputation, most
        recomputation cost saved per byte-stage held first (only recomputations in over-budget stages if asked)."""
        available = state.R | state.S
        recomputed = state.R & ~self.eye
        if over_budget_only:
            recomputed &= (state.usage.max(axis=1) > self.budget)[:, None]
        moves: list[tuple[float, Move]] = []
        for stage, node in zip(*np.nonzero(recomputed), strict=True):
            since = int(np.flatnonzero(available[:stage, node])[-1])
            span = max(int(self.memory[node]), 1) * int(stage - since)
            moves.append((-float(self.costs[node]) / span, (int(node), since + 1, int(stage))))
        moves.sort()
        bridges = []
        for _, move in moves:
            S = state.S.copy()
            S[move[1] : move[2] + 1, move[0]] = True
            bridges.append((move, S))
        return bridges

    def _improve(self, state: _State) -> _State:
        """Descent: the cheapest move within the budget; when none fits, a move then a repair, if cheaper.

        A move's effect (cost change, fit, the stages it touches) is remembered until a taken move touches the
        same stages (or the ones next to them); the move chosen is evaluated afresh before it is taken.
        """
        known: dict[Move, tuple[float, bool, np.ndarray]] = {}
        failed: dict[Move, np.ndarray] = {}  # over-budget moves whose repair did not pay, with their stages
        while not self.control.stopped:
            moves = self._bridges(state)
            fresh: dict[Move, _State] = {}
            for move, S in moves:
                if move in known:
                    continue
                if self.control.stopped:
                    return state
                candidate = fresh[move] = self.derive(state, S)
                known[move] = (candidate.cost - state.cost, candidate.excess == 0, self._touched(state, candidate))
            applicable = {move: S for move, S in moves}
            ranked = sorted(applicable, key=lambda move: known[move][0])
            chosen: _State | None = None
            for move in ranked:
                delta, fits, _ = known[move]
                if delta >= -1e-9:
                    break
                if fits:
                    candidate = fresh.get(move) or self.derive(state, applicable[move])
                    if candidate.excess == 0 and candidate.cost < state.cost - 1e-9:
                        chosen = candidate
                        break
                    known[move] = (candidate.cost - state.cost, candidate.excess == 0, self._touched(state, candidate))
            if chosen is None:
                tried = 0
                for move in ranked:
                    delta, fits, touched = known[move]
                    if delta >= -1e-9 or tried >= COMPOUND_MOVES:
                        break
                    if fits or move in failed:
                        continue
                    tried += 1
                    candidate = fresh.get(move) or self.derive(state, applicable[move])
                    repaired = self._repair(candidate)
                    if repaired is not None and repaired.cost < state.cost - 1e-9:
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
    def _touched(before: _State, after: _State) -> np.ndarray:
        """bool[T]: the stages whose R, S or usage differ."""
        return ((before.R != after.R) | (before.S != after.S) | (before.usage != after.usage)).any(axis=1)


def _with_previous(stages: np.ndarray) -> np.ndarray:
    """The stages and the ones just before them (R[t] depends on S[t] and S[t + 1]), sorted, without -1."""
    return np.union1d(stages, stages[stages > 0] - 1)


def _runs(column: np.ndarray) -> list[tuple[int, int]]:
    """The maximal runs [first, last] (inclusive) of True in a bool vector."""
    steps = np.diff(np.concatenate([[0], column.astype(np.int8), [0]]))
    return list(zip(np.flatnonzero(steps == 1).tolist(), (np.flatnonzero(steps == -1) - 1).tolist(), strict=True))
