"""optimal: the paper's MILP (eq. 9) solved by HiGHS, SCIP or Gurobi, warm-started from the best baseline.

The LP relaxation is solved first: when its bound already meets the best baseline's cost, that baseline is proven
optimal without branching (this formulation's LP is tight on chains: the n = 128 chain at half memory is proven in
the LP's 20 s where the MIP solvers spent 60 s without closing the root).

A time-limited solve never returns worse than that warm start, and `status` is "optimal" only when the solver
proved it (within `mip_gap`) on an exactly scaled model.
"""

from __future__ import annotations

import logging
import time

import numpy as np

from checkmate.bounds import activation_floor, infeasible_budget, lower_bound
from checkmate.errors import InfeasibleBudget
from checkmate.graph import Graph
from checkmate.milp.backends import available_backends, get_backend
from checkmate.milp.formulation import VariableIndex, decode, encode, encode_solution
from checkmate.milp.problem import MilpProblem, MilpSolution, SolveOptions, SolveStatus
from checkmate.milp.scaling import DEFAULT_RESOLUTION, memory_scale
from checkmate.plan import Plan, cheapest_r, make_plan
from checkmate.strategies.checkpoint_all import checkpoint_all
from checkmate.strategies.registry import register
from checkmate.strategies.warm_start import best_baseline, lowest_peak_baseline
from checkmate.units import format_bytes

log = logging.getLogger(__name__)

METHOD = "optimal"
# backend="auto": the first installed of these. HiGHS solved every case of benchmarks/milp_backends.py (chains up
# to T = 129 and random graphs, warm-started) to optimality faster than SCIP; see BENCHMARKS.md.
AUTO_ORDER = ("highs", "scip")


def choose_backend(name: str) -> str:
    """Resolve "auto" to a concrete, installed backend name."""
    if name != "auto":
        return name
    installed = available_backends()
    return next((candidate for candidate in AUTO_ORDER if candidate in installed), AUTO_ORDER[0])


@register(METHOD, "the paper's MILP: the cheapest plan within the budget (proven optimal when the solver finishes)")
def optimal(
    graph: Graph,
    budget: int | None,
    *,
    backend: str = "auto",
    time_limit: float | None = None,
    mip_gap: float = 1e-4,
    threads: int | None = None,
    verbose: bool = False,
    seed: int = 0,
    warm_start: bool = True,
    memory_resolution: int = DEFAULT_RESOLUTION,
) -> Plan:
    """Solve the MILP for `graph` within `budget` bytes.

    Args:
        graph: the training graph.
        budget: bytes, fixed memory included; None means no limit (then checkpoint_all is optimal).
        backend: "auto", "highs", "scip" or "gurobi".
        time_limit: seconds for the solver; on expiry the best plan found (never worse than the warm start).
        mip_gap: relative gap at which the solver stops and the plan counts as optimal.
        threads, verbose, seed: passed to the solver.
        warm_start: hand the best baseline plan to the solver as its first incumbent (it is the fallback either way).
        memory_resolution: at most this many memory units for the largest node (see checkmate.milp.scaling).

    Raises:
        InfeasibleBudget: no schedule fits; the error names the smallest budget for which one exists.
    """
    started = time.perf_counter()
    if budget is None:
        unlimited = checkpoint_all(graph, None)
        return make_plan(graph, unlimited.R, unlimited.S, method=METHOD, status="optimal", lower_bound=unlimited.cost)
    if budget < activation_floor(graph):
        raise infeasible_budget(graph, budget, method=METHOD)
    scale = memory_scale(graph, memory_resolution)
    problem, index = encode(graph, scale.budget_units(budget, graph.fixed_memory), scale)
    log.info(
        "MILP: %d variables, %d rows, %d nonzeros", problem.num_variables, problem.num_constraints, problem.num_nonzeros
    )
    fallback = best_baseline(graph, budget)
    lp_bound = _lp_bound(graph, budget, problem, scale.exact, time_limit)
    if fallback is not None and lp_bound is not None and fallback.cost - lp_bound <= mip_gap * fallback.cost + 1e-9:
        log.info("the LP bound %.6g proves the baseline %s optimal", lp_bound, fallback.method)
        return _final(graph, budget, fallback, proven=True, bound=lp_bound, started=started)
    remaining = None if time_limit is None else max(1.0, time_limit - (time.perf_counter() - started))
    options = SolveOptions(time_limit=remaining, mip_gap=mip_gap, threads=threads, verbose=verbose, seed=seed)
    solution = get_backend(choose_backend(backend)).solve(
        problem, options, _start(graph, problem, index, fallback) if warm_start else None
    )
    if solution.status is SolveStatus.INFEASIBLE and scale.exact:
        raise infeasible_budget(graph, budget, method=METHOD)
    bounds = [b for b in (lp_bound, solution.bound if scale.exact else None) if b is not None]
    plan = _best_plan(graph, budget, solution, index, fallback)
    if plan is None:
        raise _nothing_found(graph, budget, solution, time_limit)
    proven = (
        solution.status is SolveStatus.OPTIMAL and scale.exact and plan.cost <= (solution.objective or np.inf) + 1e-6
    )
    return _final(graph, budget, plan, proven=proven, bound=max(bounds, default=None), started=started)


def _final(graph: Graph, budget: int, plan: Plan, *, proven: bool, bound: float | None, started: float) -> Plan:
    final = make_plan(
        graph,
        plan.R,
        plan.S,
        method=METHOD,
        solve_time=time.perf_counter() - started,
        budget=budget,
        status="optimal" if proven else "feasible",
        lower_bound=None if bound is None else min(bound, plan.cost),
    )
    assert final.peak_memory <= budget, "the MILP's plan must fit the budget it was solved for"
    return final


def _lp_bound(graph: Graph, budget: int, problem: MilpProblem, exact: bool, time_limit: float | None) -> float | None:
    """The LP bound, valid in bytes (None if the LP ran out of time); raises when the LP proves infeasibility."""
    if not exact:
        return _relaxed_bound(graph, budget, time_limit)
    solution = get_backend("highs").solve(problem.relaxed(), SolveOptions(time_limit=time_limit))
    if solution.status is SolveStatus.INFEASIBLE:
        raise infeasible_budget(graph, budget, method=METHOD)
    return solution.objective if solution.status is SolveStatus.OPTIMAL else None


def _start(graph: Graph, problem: MilpProblem, index: VariableIndex, fallback: Plan | None) -> np.ndarray | None:
    """The warm start vector of the fallback plan, when it satisfies the (unit-rounded) model."""
    if fallback is None:
        return None
    start = encode_solution(graph, index, fallback.R, fallback.S)
    violation = problem.max_violation(start)
    if violation > 1e-6:
        log.info("the warm start %s breaks the unit-rounded model by %g; solving cold", fallback.method, violation)
        return None
    return start


def _best_plan(
    graph: Graph, budget: int, solution: MilpSolution, index: VariableIndex, fallback: Plan | None
) -> Plan | None:
    """The solver's plan with R pruned to the cheapest for its S (when that stays within budget), or the fallback."""
    candidates = [] if fallback is None else [fallback]
    if solution.x is not None:
        R, S = decode(solution.x, index)
        candidates.append(make_plan(graph, R, S, method=METHOD))
        pruned = make_plan(graph, cheapest_r(graph, S), S, method=METHOD)
        if pruned.peak_memory <= budget:
            candidates.append(pruned)
    fitting = [plan for plan in candidates if plan.peak_memory <= budget]
    return min(fitting, key=lambda plan: (plan.cost, plan is fallback)) if fitting else None


def _relaxed_bound(graph: Graph, budget: int, time_limit: float | None) -> float | None:
    try:
        return lower_bound(graph, budget, time_limit=time_limit)
    except InfeasibleBudget:
        return None


def _nothing_found(graph: Graph, budget: int, solution: MilpSolution, time_limit: float | None) -> InfeasibleBudget:
    if solution.status is SolveStatus.INFEASIBLE:
        return infeasible_budget(graph, budget, method=METHOD)
    known = lowest_peak_baseline(graph)
    works = "" if known is None else f"; {known.method} fits {format_bytes(known.peak_memory)} ({known.peak_memory} B)"
    return InfeasibleBudget(
        f"{METHOD}: no plan within {format_bytes(budget)} ({budget} bytes) was found in the time limit "
        f"({time_limit} s) and no baseline fits; infeasibility is not proven. Raise time_limit or the budget{works}",
        budget=budget,
        minimum=None if known is None else known.peak_memory,
    )
