"""The closure bound: at one stage, what crosses it must be held there or rebuilt after it, inputs and all.

Take any stage b and any valid plan (R, S) within `budget` (the simulator's memory model, `checkmate.simulate`).
Call a node v < b *crossing* when it has a user w > b. For every node u < b define

    h_u = S[b+1, u]                                   (u is held out of stage b),
    r_u = 1 if R[s, u] = 1 for some stage s > b       (u is computed again after stage b).

Crossing (row `h_v + r_v >= 1`). Node w runs in stage w (8a) and needs v there (1b): R[w, v] = 1, so r_v = 1, or
S[w, v] = 1. Following (1c) S[t, v] <= R[t-1, v] + S[t-1, v] back from stage w, either some stage in (b, w) computes
v (r_v = 1) or S[b+1, v] = 1 (h_v = 1).

Closure (row `h_u + r_u >= r_v` for every input u of v). Let s > b be a stage that computes v. Its input u is
computed in stage s too (r_u = 1) or held into it, and then, by the same argument as above, computed in some stage
in (b, s) (r_u = 1) or held out of stage b (h_u = 1). So every node that a crossing node may be rebuilt from is a
column, and F, the crossing nodes with all their ancestors, is the set of columns.

Memory (row `sum_u M_u h_u <= budget - base_b`). When node b runs in stage b, what the simulator holds includes:
the fixed memory, node b's output and first-run workspace, each distinct input of b (computed earlier in stage b or
held into it, freed only after its last reader in the stage, b or later), what nodes 0..b retain
(`Graph.retained_through`), and every value held out of stage b: a value held into stage b + 1 is never freed in
stage b, and a node u < b computed in stage b runs before node b. These are distinct, so their bytes fit in the
budget. The inputs of b are in base_b already: their h columns carry no bytes.

Cost. Every node runs once in its own stage (at its cost c_i), and each u with r_u = 1 runs once more, after stage
b > u: a recomputation, at its recompute cost c'_u (`Node.recompute_cost`). So every plan within the budget costs
at least  sum_i c_i + min sum_u c'_u r_u  over the rows above: a proven lower bound, for each stage b. The bound is
the largest over the stages tried.

Why it is stronger than the retention bound (`checkmate.bounds.retention`) where one stage binds: the retention
MILP prices each value's gaps on their own and its input cover charges a rebuilt value's inputs one level deep;
here a rebuilt value's whole ancestry is charged at the stage that binds. On transformers, whose language-model or
classifier head makes one stage of the backward the bottleneck, it is the tighter of the two
(`benchmarks/investigations/retention_bounds.py`; BENCHMARKS.md, "Large graphs").

Each stage's MILP has two binaries per node of F and one row per edge into F, far smaller than the paper's MILP.
The stages tried are those where memory is tightest: base_b plus every value that must be live across stage b if
nothing were rebuilt.
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

from checkmate.bounds.gaps import last_use, memory_gaps, spanning_bytes, working_set
from checkmate.byte_sizes import format_bytes
from checkmate.errors import InfeasibleBudget
from checkmate.graph import Graph
from checkmate.milp.backends import lp_backend
from checkmate.milp.backends.policy import solver_time_limit
from checkmate.milp.problem import MilpProblem, SolveOptions, SolveStatus

log = logging.getLogger(__name__)

STAGES_TRIED = 8  # the stages with the tightest memory; on the graph set the bound's best stage is among the first few


@dataclass(frozen=True)
class ClosureBound:
    """The closure bound of `closure_bound`.

    Attributes:
        bound: a proven lower bound on the cost of any plan within the budget, in the graph's cost units; never
            below graph.least_cost (every node once).
        stage: the stage whose MILP gave it, or None when no stage raised it above every node once.
        proven: True when every stage tried was solved to optimality (a stage stopped by the clock counts its dual
            bound, which is valid but may be lower).
        seconds: wall-clock seconds spent.
        held: the nodes the answer of `stage`'s MILP holds out of that stage (h = 1), or None without one.
        rebuilt: the nodes that answer rebuilds after the stage (r = 1, h = 0), or None: with `held`, a starting
            point for a plan (`checkmate.strategies.closure_start`), not a plan.
        away: the nodes that answer moves to host memory across the stage (a = 1, with moves:
            `checkmate.bounds.moved_closure`; empty without), or None.
    """

    bound: float
    stage: int | None
    proven: bool
    seconds: float
    held: np.ndarray | None = field(default=None, compare=False)
    rebuilt: np.ndarray | None = field(default=None, compare=False)
    away: np.ndarray | None = field(default=None, compare=False)


def closure_bound(
    graph: Graph,
    budget: int,
    *,
    time_limit: float | None = None,
    stages: int = STAGES_TRIED,
    load_seconds_per_variable: float = 0.0,
    should_stop: Callable[[], bool] | None = None,
    interrupted: Callable[[], bool] | None = None,
    problem_of: Callable[[Graph, int, int], StageMilp | None] | None = None,
) -> ClosureBound:
    """A proven lower bound on the cost of any plan of `graph` whose peak is at most `budget` bytes (module doc).

    Args:
        graph: the training graph.
        budget: bytes, fixed memory included.
        time_limit: seconds for every stage's MILP together, or None for no limit. Stages left when it runs out
            are not tried.
        stages: how many of the stages with the tightest memory to try.
        load_seconds_per_variable: a stage's MILP is not handed to the solver when less time is left than this
            times its variables.
        should_stop: polled by the solver and between stages; once it returns True, the stages left are not tried.
        interrupted: a stop the solver is not waited for (`SolveOptions.interrupted`).
        problem_of: a stage's MILP (graph, budget, stage), None when nothing crosses it; `stage_problem` by default,
            `checkmate.bounds.moved_closure.moved_stage_problem` where values may move to host memory.

    Raises:
        InfeasibleBudget: when a stage's MILP is infeasible: no plan fits (`minimum` is None).
    """
    problem_of = stage_problem if problem_of is None else problem_of
    started = time.perf_counter()
    base = _base(graph)
    if base.max(initial=0) > budget:
        stage = int(np.argmax(base))
        raise _infeasible(
            graph, budget, f"node {stage} ({graph.nodes[stage].name!r}) needs more with its inputs and workspace"
        )
    every_node_once = graph.least_cost
    best, best_stage, proven = 0.0, None, True
    answer: tuple[np.ndarray, np.ndarray, np.ndarray] | None = None
    for stage in tightest_stages(graph, budget, stages):
        left = None if time_limit is None else time_limit - (time.perf_counter() - started)
        milp = problem_of(graph, budget, stage)
        if milp is None:
            continue
        problem = milp.problem
        limit = solver_time_limit(left, problem.num_variables, load_seconds_per_variable)
        if (limit is not None and limit <= 0) or (should_stop is not None and should_stop()):
            proven = False
            break
        extra, solved, x = solve_stage(problem, limit, should_stop, interrupted)
        if extra is None:
            raise _infeasible(
                graph,
                budget,
                f"what crosses stage {stage} ({graph.nodes[stage].name!r}) can neither be held nor be rebuilt",
            )
        proven &= solved
        if extra > best:
            best, best_stage = extra, stage
            answer = None if x is None else stage_answer(milp.nodes, x)
    seconds = time.perf_counter() - started
    log.info("closure bound: +%.6g over every node once, at stage %s (%.2f s)", best, best_stage, seconds)
    held, rebuilt, away = answer if answer is not None else (None, None, None)
    return ClosureBound(every_node_once + best, best_stage, proven, seconds, held, rebuilt, away)


def tightest_stages(graph: Graph, budget: int, count: int) -> np.ndarray:
    """The `count` stages where base_b plus every value live across stage b (were nothing rebuilt) most exceeds
    the budget, tightest first; stages that could hold all of that are left out (their bound is zero)."""
    pressure = _base(graph) + spanning_bytes(graph, memory_gaps(graph)) - budget
    order = np.argsort(-pressure, kind="stable")
    return order[pressure[order] > 0][:count]


@dataclass(frozen=True)
class StageMilp:
    """The closure MILP of one stage: its columns are h over `nodes` (F), then r over `nodes`; its objective is the
    extra cost (the r at their recompute costs); its rows are the module doc's: one per crossing node, then one per
    edge into F, then memory (in bytes over the largest column's).

    Attributes:
        problem: the MILP.
        nodes: F, the columns' nodes, sorted.
        crossing: the column (index into `nodes`) of each crossing row's node.
        sources: the column of each edge row's source.
    """

    problem: MilpProblem
    nodes: np.ndarray
    crossing: np.ndarray
    sources: np.ndarray


def stage_problem(graph: Graph, budget: int, stage: int) -> StageMilp | None:
    """The closure MILP of `stage`, or None when nothing crosses it."""
    capacity = budget - int(_base(graph)[stage])
    crossing = np.flatnonzero((np.arange(graph.size) < stage) & (last_use(graph) > stage) & (graph.memory > 0))
    if crossing.size == 0:
        return None
    columns = _ancestors(graph, crossing)
    n = columns.size
    column_of = np.full(graph.size, -1, dtype=np.int64)
    column_of[columns] = np.arange(n)
    edges = graph.edges[column_of[graph.edges[:, 1]] >= 0]
    source, user = column_of[edges[:, 0]], column_of[edges[:, 1]]
    crossing_rows, edge_rows = np.arange(crossing.size), crossing.size + np.arange(len(edges))
    memory_row = crossing.size + len(edges)
    held_bytes = graph.memory[columns].astype(np.float64)
    held_bytes[np.isin(columns, graph.predecessors[stage])] = 0.0  # the inputs of b are in base_b
    unit = float(max(held_bytes.max(initial=0.0), 1.0))
    rows = np.concatenate([crossing_rows, crossing_rows, edge_rows, edge_rows, edge_rows, np.full(n, memory_row)])
    cols = np.concatenate([column_of[crossing], n + column_of[crossing], source, n + source, n + user, np.arange(n)])
    values = np.concatenate(
        [np.ones(2 * crossing.size), np.ones(2 * len(edges)), -np.ones(len(edges)), -held_bytes / unit]
    )
    lower = np.concatenate([np.ones(crossing.size), np.zeros(len(edges)), [-capacity / unit]])
    recomputations = graph.recompute_costs[columns]  # r_u counts a run after stage b > u
    problem = MilpProblem(
        c=np.concatenate([np.zeros(n), recomputations]),
        A=sp.csc_array((values, (rows, cols)), shape=(lower.size, 2 * n)),
        row_lower=lower,
        row_upper=np.full(lower.size, np.inf),
        col_lower=np.zeros(2 * n),
        col_upper=np.ones(2 * n),
        integer=np.ones(2 * n, dtype=bool),
    )
    return StageMilp(problem, columns, column_of[crossing], source)


def _base(graph: Graph) -> np.ndarray:
    """int64[T]: base_b, the bytes live when node b runs whatever the plan (module doc), fixed memory included."""
    return graph.fixed_memory + working_set(graph)


def _ancestors(graph: Graph, nodes: np.ndarray) -> np.ndarray:
    """The sorted nodes with all their ancestors (predecessors are earlier, so one sweep from the last suffices)."""
    marked = np.zeros(graph.size, dtype=bool)
    marked[nodes] = True
    predecessors = graph.predecessors
    for node in range(int(nodes.max()), -1, -1):
        if marked[node]:
            marked[list(predecessors[node])] = True
    return np.flatnonzero(marked)


def stage_answer(nodes: np.ndarray, x: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The nodes a stage MILP's solution holds out of the stage, those it rebuilds after it without holding, and
    those it moves to host memory across it (the a columns of a MILP with moves; none without)."""
    n = nodes.size
    held = x[:n] > 0.5
    away = x[2 * n : 3 * n] > 0.5 if x.size > 2 * n else np.zeros(n, dtype=bool)
    return nodes[held], nodes[(x[n : 2 * n] > 0.5) & ~held], nodes[away & ~held]


def solve_stage(
    problem: MilpProblem,
    time_limit: float | None,
    should_stop: Callable[[], bool] | None = None,
    interrupted: Callable[[], bool] | None = None,
) -> tuple[float | None, bool, np.ndarray | None]:
    """The MILP's proven extra cost (its dual bound when stopped by the clock; zero when it has none; None when the
    MILP is infeasible), whether it was solved to optimality, and its solution (None without one). Costs are
    scaled by a power of two for the solver (an exact division) and scaled back."""
    unit = 2.0 ** math.ceil(math.log2(max(float(problem.c.max(initial=0.0)), 1e-300)))
    solution = lp_backend().solve(
        dataclasses.replace(problem, c=problem.c / unit),
        SolveOptions(time_limit=time_limit, mip_gap=1e-9, should_stop=should_stop, interrupted=interrupted),
    )
    if solution.status is SolveStatus.INFEASIBLE:
        return None, True, None
    proven = solution.status is SolveStatus.OPTIMAL
    dual = solution.bound if solution.bound is not None else (solution.objective if proven else None)
    return (0.0 if dual is None else max(0.0, dual) * unit), proven and dual is not None, solution.x


def _infeasible(graph: Graph, budget: int, reason: str) -> InfeasibleBudget:
    return InfeasibleBudget(
        f"closure_bound: no schedule fits {format_bytes(budget)} ({budget} bytes): {reason}. "
        "Use checkmate.minimum_budget(graph) for the smallest budget that works",
        budget=budget,
        minimum=None,
    )
