"""A retention lower bound on the cost of any plan within a budget: a small MILP over which values are kept.

The paper's LP relaxation is no help on real training graphs of hundreds of nodes: it equals the cost of running
every node once, and it is slow to solve at that size. This bound is a MILP with one binary per (node, gap
between two consecutive uses), one row per stage and one per gap, and it solves in seconds on ~1,000 nodes.

The argument, for any valid plan (R, S) within `budget` (the simulator's memory model, `checkmate.simulate`):

Gaps. Let node i have the distinct users u_1 < ... < u_m (all > i). Its gaps are the stage ranges (a, b] =
(i, u_1], (u_1, u_2], ..., (u_{m-1}, u_m]; they are disjoint, and none contains stage i. For each gap define

    x[i, g] = 1 if some stage s in (a, b] computes node i (R[s, i] = 1), else 0.

Cost. Node i runs in stage i (8a), at its cost c_i, and once more in a distinct stage for every gap with
x[i, g] = 1 (the gaps are disjoint and lie after stage i): a recomputation, at its recompute cost c'_i
(`Node.recompute_cost`). So the plan's cost is at least  sum_i c_i + sum_(i, g) c'_i x[i, g]  (objective).

Kept gap. If x[i, g] = 0, stage b still computes its user b, which needs i: R[b, i] = 1 or S[b, i] = 1 (1b), and
R[b, i] = 0, so S[b, i] = 1; by (1c) S[t, i] <= R[t-1, i] + S[t-1, i] with R[t-1, i] = 0 for t-1 in (a, b), so
S[t, i] = 1 for every t in (a, b]: node i is held into every stage a+1, ..., b. A value held into stage t + 1 is
never freed in stage t (the simulator frees an input only when it is not held next, and drops at the stage's end
only what is not held next), so it is live at every moment of stage t for a < t < b, and live from the start of
stage b until node b has run.

The rows (each is written next to the code that builds it, in `_stage_rows` and `_recompute_rows`) say that the
live bytes at one moment of the plan, counted from these facts alone, fit in budget - fixed_memory. The optimum of
the small MILP is therefore at most the cost of every plan within the budget: a proven lower bound. It is also at
least sum_i c_i (every node once), the trivial bound.

The input cover (`checkmate.bounds.input_cover`) adds columns and rows that charge a recomputation for the inputs it
needs once they are dead, and for holding the recomputed value until its user reads it; its held columns enter the
stage rows here. It is what lifts the bound on transformers (`benchmarks/investigations/retention_bounds.py`).

Memory is in bytes divided by one power of two (an exact division in float64), and the costs likewise, so no
rounding weakens or invalidates the rows.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import scipy.sparse as sp

from checkmate.bounds.gaps import (
    Gaps,
    Rows,
    gaps_of_every_node,
    inputs_bytes,
    memory_gaps,
    spanning_bytes,
    working_set,
)
from checkmate.bounds.input_cover import InputCover, input_cover
from checkmate.byte_sizes import format_bytes
from checkmate.errors import InfeasibleBudget
from checkmate.graph import Graph
from checkmate.milp.backends import lp_backend
from checkmate.milp.backends.policy import solver_time_limit, too_little_time
from checkmate.milp.formulation import expand_ranges
from checkmate.milp.problem import MilpProblem, SolveOptions, SolveStatus

log = logging.getLogger(__name__)

# The MILP with the input cover is solved after its LP relaxation only when at least MILP_HEADROOM times the
# relaxation's seconds plus MILP_MINIMUM_SECONDS are left: HiGHS does not check its clock while it adds cuts at the
# root, so a MILP started with too little time overruns the limit several times over, and the relaxation may already
# give its bound. Where the MILP runs it can raise the bound (VGG16).
MILP_HEADROOM = 10.0
MILP_MINIMUM_SECONDS = 1.0

# The retention bound is computed only when at least this many seconds per nonzero of its MILP's matrix are left
# (the trivial bound otherwise): HiGHS presolves it without checking its clock, so given less it overruns any time
# limit; the graph set's real graphs solve it well within this allowance.
PRESOLVE_SECONDS_PER_NONZERO = 1 / 150_000
_SCALE_BITS = 20  # memory and costs are divided by a power of two so that the largest figure is about 2**20
_CHUNK = 1 << 22  # pairs of gaps compared at once when looking for the gaps that contain a gap


@dataclass(frozen=True)
class RetentionBound:
    """The retention bound of `retention_bound`.

    Attributes:
        bound: a proven lower bound on the cost of any plan within the budget, in the graph's cost units; never
            below graph.least_cost (every node once). When the MILP stops at its time limit this is its proven
            dual bound, so it is valid but may be weaker than the MILP's optimum.
        proven: True when the MILP was solved to optimality (then `bound` is its optimum): the one with the input
            cover wherever the cover adds anything (skipped for lack of time, it leaves this False).
        seconds: wall-clock seconds spent, building the MILP included.
        held: bool[T, T], the checkpoints S of the answer of the MILP without the input cover (each kept gap held
            through its stages, nodes of zero bytes held throughout), or None when it found none: a starting point
            for a plan, not a plan.
        held_with_cover: the same from the answer of the MILP with the input cover, when it was solved; None
            otherwise. It charges memory only where rows can bind, so it is the worse start on transformers (its
            plan there may not fit the budget), and the better one on VGG16 (its plan is the optimum there).
    """

    bound: float
    proven: bool
    seconds: float
    held: np.ndarray | None = field(default=None, compare=False)
    held_with_cover: np.ndarray | None = field(default=None, compare=False)


def retention_bound(
    graph: Graph,
    budget: int,
    *,
    time_limit: float | None = None,
    load_seconds_per_variable: float = 0.0,
    cover: bool = True,
    should_stop: Callable[[], bool] | None = None,
    interrupted: Callable[[], bool] | None = None,
) -> RetentionBound:
    """A proven lower bound on the cost of any plan of `graph` whose peak is at most `budget` bytes.

    See the module docstring for the argument. The retention MILP alone is solved first (one binary per edge of
    the graph at most, one row per node and per edge: seconds on ~1,000 nodes), then, in the time left, the LP
    relaxation of the MILP with the input cover (`checkmate.bounds.input_cover`), which is tighter on transformers
    and larger, and that MILP itself when enough time is left (`MILP_HEADROOM`). The bound is the best of them; on a
    time limit a MILP's dual bound counts instead of its optimum.

    Args:
        graph: the training graph.
        budget: bytes, fixed memory included.
        time_limit: seconds for both solves, building included, or None for no limit.
        load_seconds_per_variable: the second MILP is not solved when less time is left than this times its
            variables (the solver would overrun the limit loading it).
        cover: False solves the retention MILP alone (to measure what the input cover adds).
        should_stop: polled by the solver; when it returns True the solves stop and what they proved counts.
        interrupted: a stop the solver is not waited for (`SolveOptions.interrupted`).

    Raises:
        InfeasibleBudget: when no plan fits the budget: some node cannot run even with nothing else live, or the
            MILP itself is infeasible. `minimum` is None (the exact smallest budget is not computed here).
    """
    started = time.perf_counter()

    def left() -> float | None:
        return None if time_limit is None else time_limit - (time.perf_counter() - started)

    encoded = _encode(graph, budget, cover=False)
    if too_little_time(time_limit, encoded.problem.A.nnz, PRESOLVE_SECONDS_PER_NONZERO):
        presolve = encoded.problem.A.nnz * PRESOLVE_SECONDS_PER_NONZERO
        log.info("retention bound not solved: %.2f s is too little to presolve its MILP (%.2f s)", time_limit, presolve)
        return RetentionBound(graph.least_cost, False, time.perf_counter() - started, None, None)
    plain = _solved(
        graph, budget, encoded, SolveOptions(time_limit=time_limit, should_stop=should_stop, interrupted=interrupted)
    )
    answers = [plain]

    def stopped() -> bool:
        return should_stop is not None and should_stop()

    covered = _encode(graph, budget) if cover and not stopped() else None
    adds_rows = covered is not None and covered.cover.num_columns > 0
    variables = 0 if covered is None else covered.problem.num_variables

    def options(remaining: float | None) -> SolveOptions:
        limit = solver_time_limit(remaining, variables, load_seconds_per_variable)
        return SolveOptions(time_limit=limit, should_stop=should_stop, interrupted=interrupted)

    if (
        covered is not None
        and adds_rows
        and not stopped()
        and not too_little_time(left(), variables, load_seconds_per_variable)
    ):
        relaxation_started = time.perf_counter()
        answers.append(_relaxed(covered, options(left())))
        relaxation_seconds = time.perf_counter() - relaxation_started
        remaining = left()
        if not stopped() and (
            remaining is None or remaining >= MILP_HEADROOM * relaxation_seconds + MILP_MINIMUM_SECONDS
        ):
            answers.append(_solved(graph, budget, covered, options(remaining)))
    best = max(answers, key=lambda answer: answer.extra)
    log.info(
        "retention bound: +%.6g without the input cover, +%.6g with it (%s)",
        plain.extra,
        answers[-1].extra if len(answers) > 1 else float("nan"),
        ["not solved", "its LP relaxation", "its MILP"][len(answers) - 1],
    )
    solved_to_the_end = len(answers) == 3 or not (adds_rows or (cover and covered is None))
    return RetentionBound(
        graph.least_cost + best.extra,
        answers[-1].proven and solved_to_the_end,
        time.perf_counter() - started,
        plain.held,
        answers[2].held if len(answers) == 3 else None,
    )


@dataclass(frozen=True)
class _Answer:
    """A retention MILP's proven extra cost (above every node once), whether it is the optimum, and its answer."""

    extra: float
    proven: bool
    held: np.ndarray | None


def _relaxed(encoded: _Encoded, options: SolveOptions) -> _Answer:
    """The LP relaxation of a retention MILP: a valid bound when it finishes (the trivial one otherwise), no answer."""
    solution = lp_backend().solve(encoded.problem.relaxed(), options)
    if solution.status is not SolveStatus.OPTIMAL or solution.objective is None:
        log.info("the retention LP relaxation did not finish; counting the trivial bound (each node once)")
        return _Answer(0.0, False, None)
    return _Answer(max(0.0, solution.objective) * encoded.cost_unit, False, None)


def _solved(graph: Graph, budget: int, encoded: _Encoded, options: SolveOptions) -> _Answer:
    gaps, problem = encoded.gaps, encoded.problem
    if problem.num_variables == 0:
        return _Answer(0.0, True, _held(graph, gaps, np.zeros(0)))
    solution = lp_backend().solve(problem, dataclasses.replace(options, mip_gap=1e-9, mip_abs_gap=0.0))
    if solution.status is SolveStatus.INFEASIBLE:
        raise _infeasible(graph, budget, "the retention MILP is infeasible: some value can be neither kept nor rebuilt")
    proven = solution.status is SolveStatus.OPTIMAL
    dual = solution.bound if solution.bound is not None else (solution.objective if proven else None)
    if dual is None:
        log.info("the retention MILP stopped without a dual bound; counting the trivial bound (each node once)")
    extra = 0.0 if dual is None else max(0.0, dual) * encoded.cost_unit
    held = None if solution.x is None else _held(graph, gaps, solution.x[: gaps.node.size])
    return _Answer(extra, proven and dual is not None, held)


def _held(graph: Graph, gaps: Gaps, x: np.ndarray) -> np.ndarray:
    """S with every kept gap (x < 1/2) held through its stages (a, b], and nodes of zero bytes always held."""
    S = np.zeros((graph.size, graph.size), dtype=bool)
    every = gaps_of_every_node(graph)
    free = graph.memory[every.node] == 0
    kept = (
        np.concatenate([every.node[free], gaps.node[x < 0.5]]),
        np.concatenate([every.a[free], gaps.a[x < 0.5]]),
        np.concatenate([every.b[free], gaps.b[x < 0.5]]),
    )
    owner, stage = expand_ranges(kept[1] + 1, kept[2] + 1)
    S[stage, kept[0][owner]] = True
    return S


def _encode(graph: Graph, budget: int, *, recompute_rows: bool = True, cover: bool = True) -> _Encoded:
    """The retention MILP (objective: the extra cost only, scaled) and the factor that turns its objective to cost.

    Its first columns are the gaps' x (`memory_gaps`); with `cover`, the input cover's columns follow
    (`checkmate.bounds.input_cover`, charged at the stages whose row can bind). `recompute_rows=False` and
    `cover=False` leave out those rows (for measuring what they add).
    """
    capacity = budget - graph.fixed_memory
    gaps = memory_gaps(graph)
    inputs = inputs_bytes(graph)
    need = _stage_need(graph, gaps, capacity)
    added = input_cover(graph, gaps, np.flatnonzero(need > 0) if cover else np.zeros(0, dtype=np.int64))
    memory_blocks = [_stage_rows(graph, gaps, need, _held_terms(graph, gaps, added))]
    fixed_zero = np.zeros(gaps.node.size, dtype=bool)
    if recompute_rows:
        rows, fixed_zero = _recompute_rows(graph, gaps, capacity, inputs)
        memory_blocks.append(rows)
    memory = _stacked(memory_blocks)
    memory_unit = _power_of_two_unit(
        max(float(np.abs(memory.values).max(initial=0)), float(memory.lower.max(initial=0)))
    )
    logic = added.rows
    columns = gaps.node.size + added.num_columns
    A = sp.vstack(
        [
            sp.csc_array((memory.values / memory_unit, (memory.rows, memory.cols)), shape=(memory.lower.size, columns)),
            sp.csc_array((logic.values, (logic.rows, logic.cols)), shape=(logic.lower.size, columns)),
        ],
        format="csc",
    )
    tails = added.tail_nodes
    # a gap's or a tail's run is after the node's own stage: a recomputation, at its recompute cost
    recomputations = graph.recompute_costs
    costs = np.concatenate([recomputations[gaps.node], recomputations[tails], np.zeros(added.held_node.size)])
    cost_unit = _power_of_two_unit(float(costs.max(initial=0)))
    problem = MilpProblem(
        c=costs / cost_unit,
        A=A,
        row_lower=np.concatenate([memory.lower / memory_unit, logic.lower]),
        row_upper=np.full(memory.lower.size + logic.lower.size, np.inf),
        col_lower=np.zeros(columns),
        col_upper=np.concatenate([np.where(fixed_zero, 0.0, 1.0), np.ones(added.num_columns)]),
        integer=np.arange(columns) < gaps.node.size + tails.size,
    )
    return _Encoded(problem, cost_unit, gaps, added)


@dataclass(frozen=True)
class _Encoded:
    """The retention MILP, the factor that turns its objective into cost, and what its columns stand for."""

    problem: MilpProblem
    cost_unit: float
    gaps: Gaps
    cover: InputCover


@dataclass(frozen=True)
class _HeldTerms:
    """Memory that the input cover's held columns charge to stage rows: column[k] holds bytes[k] in stage[k]."""

    stage: np.ndarray
    column: np.ndarray
    bytes: np.ndarray


def _held_terms(graph: Graph, gaps: Gaps, added: InputCover) -> _HeldTerms:
    first = gaps.node.size + added.tail_nodes.size
    return _HeldTerms(
        stage=added.held_stage,
        column=first + np.arange(added.held_node.size),
        bytes=graph.memory[added.held_node],
    )


def _stacked(blocks: list[Rows]) -> Rows:
    offsets = np.cumsum([0] + [block.lower.size for block in blocks])
    return Rows(
        rows=np.concatenate([block.rows + offset for block, offset in zip(blocks, offsets[:-1], strict=True)]),
        cols=np.concatenate([block.cols for block in blocks]),
        values=np.concatenate([block.values for block in blocks]).astype(np.float64),
        lower=np.concatenate([block.lower for block in blocks]).astype(np.float64),
    )


def _stage_need(graph: Graph, gaps: Gaps, capacity: int) -> np.ndarray:
    """int64[T]: need_t = base_t + sum of the sizes of the gaps spanning stage t - capacity (see `_stage_rows`), with
    base_t the working set of node t (`checkmate.bounds.gaps.working_set`).

    Raises InfeasibleBudget when base_t alone exceeds the capacity: then no plan fits.
    """
    base = working_set(graph)
    if base.max(initial=0) > capacity:
        t = int(np.argmax(base))
        raise _infeasible(
            graph,
            capacity + graph.fixed_memory,
            f"node {t} ({graph.nodes[t].name!r}) needs {format_bytes(int(base[t]))} with its inputs, workspace and "
            f"what is retained by then, beside {format_bytes(graph.fixed_memory)} of fixed memory",
        )
    return base + spanning_bytes(graph, gaps) - capacity


def _stage_rows(graph: Graph, gaps: Gaps, need: np.ndarray, held: _HeldTerms) -> Rows:
    """One row per stage t, for the moment node t runs in its own stage t:

        M_t + W_t + sum_{j in inputs(t)} M_j + sum_{gaps (i, g) with a < t < b} M_i (1 - x[i, g])
            + sum_{held columns k in stage t} M_k h_k <= capacity,

    capacity = budget - fixed_memory, and what nodes 0..t retain (`Node.retained`) is live then too, in the base.
    Valid: node t was just computed (M_t) and runs with its workspace W_t (the
    first-run workspace, as the simulator counts it in stage t); each distinct input j is live, being computed
    earlier in stage t or held into it, and freed only after its last consumer in the stage, which is t or later;
    a kept gap (x = 0) with a < t < b holds node i into stage t + 1, so it is live at every moment of stage t.
    These nodes are distinct: a gap with a < t < b has no user of i strictly inside it, so i is not an input of t,
    and i <= a < t. The input cover's held columns (`checkmate.bounds.input_cover`) are live all through stage t and
    distinct from these (shown there). Written as sum_g min(M_i, cap_t) x[i, g] - sum_k M_k h_k >= need_t with
    need_t = base_t + sum M_i - capacity and cap_t = need_t + sum_k M_k, the largest right-hand side the held
    columns (at most 1) allow (capping a binary's coefficient there is valid); rows with cap_t <= 0 are dropped.
    """
    gap, stage = expand_ranges(gaps.a + 1, gaps.b)
    sizes = graph.memory[gaps.node[gap]]
    cap = need + np.bincount(held.stage, weights=held.bytes, minlength=graph.size).astype(np.int64)
    tight = cap > 0
    row_of = np.cumsum(tight) - 1
    keep = tight[stage]
    charged = tight[held.stage]
    return Rows(
        rows=np.concatenate([row_of[stage[keep]], row_of[held.stage[charged]]]),
        cols=np.concatenate([gap[keep], held.column[charged]]),
        values=np.concatenate([np.minimum(sizes[keep], cap[stage[keep]]), -held.bytes[charged]]),
        lower=need[tight],
    )


def _recompute_rows(graph: Graph, gaps: Gaps, capacity: int, inputs_bytes: np.ndarray) -> tuple[Rows, np.ndarray]:
    """One row per gap (i, g) = (a, b], for the moment node i is recomputed in some stage s in (a, b] when x = 1:

        x[i, g] = 1  =>  M_i + W'_i + sum_{j in inputs(i)} M_j + sum_{kept gaps (i', g') with a' <= a, b' >= b,
                         i' not i and not an input of i} M_i' <= capacity,

    W'_i the recompute workspace (s > i); what nodes 0..a retain is live in every stage s > a, so the base counts
    it. Valid: at that moment node i was just computed and its inputs are live
    (computed earlier in stage s or held into it, freed only after their last consumer in the stage, which is i
    or later). A kept gap (a', b'] with a' < s <= b' holds i' into stage s; if s < b' it holds it into s + 1 too,
    so i' is live all stage s; if s = b', node b' = s reads i' after i (i < s), so it is not yet freed. Every s in
    (a, b] satisfies a' < s <= b' when a' <= a and b' >= b. Written as
    sum_g' min(M_i', D) x[i', g'] >= D x[i, g] with D = base + sum M_i' - capacity; rows with D <= 0 are dropped.
    When the base alone exceeds the capacity, node i can never be recomputed and x[i, g] is fixed to 0 (returned
    as a mask).
    """
    count = gaps.node.size
    node = gaps.node
    base = graph.memory[node] + graph.recompute_workspace[node] + inputs_bytes[node] + graph.retained_through[gaps.a]
    fixed_zero = base > capacity
    edge_keys = graph.edges[:, 0] * graph.size + graph.edges[:, 1]
    sizes = graph.memory[node]
    rows: list[np.ndarray] = []
    cols: list[np.ndarray] = []
    values: list[np.ndarray] = []
    lower: list[np.ndarray] = []
    emitted = 0
    step = max(1, _CHUNK // max(count, 1))
    for first in range(0, count, step):
        owners = np.arange(first, min(first + step, count))
        owners = owners[~fixed_zero[owners]]
        # contains[o, q]: gap q holds its node all through any recomputation of owner o's node
        contains = (
            (gaps.a[None, :] <= gaps.a[owners, None])
            & (gaps.b[None, :] >= gaps.b[owners, None])
            & (node[None, :] != node[owners, None])
        )
        owner_pos, other = np.nonzero(contains)
        reads = np.isin(node[other] * graph.size + node[owners[owner_pos]], edge_keys)
        owner_pos, other = owner_pos[~reads], other[~reads]
        held = np.bincount(owner_pos, weights=sizes[other], minlength=owners.size).astype(np.int64)
        deficit = base[owners] + held - capacity
        tight = deficit > 0
        keep = tight[owner_pos]
        row_of = emitted + np.cumsum(tight) - 1
        tight_owners = np.flatnonzero(tight)
        rows += [row_of[owner_pos[keep]], row_of[tight_owners]]
        cols += [other[keep], owners[tight_owners]]
        values += [np.minimum(sizes[other[keep]], deficit[owner_pos[keep]]), -deficit[tight_owners]]
        lower.append(np.zeros(tight_owners.size, dtype=np.int64))
        emitted += int(tight.sum())
    empty = np.zeros(0, dtype=np.int64)
    return Rows(
        rows=np.concatenate(rows or [empty]),
        cols=np.concatenate(cols or [empty]),
        values=np.concatenate(values or [empty]),
        lower=np.concatenate(lower or [empty]),
    ), fixed_zero


def _power_of_two_unit(largest: float) -> float:
    """2**k with largest / 2**k about 2**_SCALE_BITS (k >= 0): dividing by it is exact in float64."""
    if largest <= 0 or not math.isfinite(largest):
        return 1.0
    return float(2.0 ** max(0, math.ceil(math.log2(largest)) - _SCALE_BITS))


def _infeasible(graph: Graph, budget: int, reason: str) -> InfeasibleBudget:
    return InfeasibleBudget(
        f"retention_bound: no schedule fits {format_bytes(budget)} ({budget} bytes): {reason}. "
        f"Use checkmate.minimum_budget(graph) for the smallest budget that works",
        budget=budget,
        minimum=None,
    )
