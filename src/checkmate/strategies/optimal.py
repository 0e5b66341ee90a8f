"""optimal: the paper's MILP (eq. 9) solved by HiGHS, SCIP (or both at once) or Gurobi, warm-started.

Before the MIP: the starting plans (`checkmate.strategies.starts`: best baseline and the retention bound's answer,
each improved by hold_more) and `approx` (the paper's LP rounding with a local search; its LP is the LP bound). When
a bound already meets the best start's cost, that start is proven optimal without branching (this formulation's LP
and the retention bound are tight on chains). The MIP is warm-started from the best start, so `optimal` is never
worse than the baselines or `approx` given the same time.

A time-limited solve never returns worse than that warm start, and `status` is "optimal" only when a bound proves
it (within `mip_gap`; the MIP's own bound only on an exactly scaled model). Graphs above EXACT_NODES nodes go
through a coarse graph (`checkmate.strategies.coarsened`).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from checkmate.bounds import activation_floor
from checkmate.errors import InfeasibleBudget
from checkmate.graph import Graph
from checkmate.milp.backends import available_backends, check_backend_name, get_backend
from checkmate.milp.formulation import VariableIndex, decode, encode, encode_solution
from checkmate.milp.problem import MilpProblem, MilpSolution, SolveOptions, SolveStatus
from checkmate.milp.scaling import DEFAULT_RESOLUTION, memory_scale
from checkmate.plan import Plan, cheapest_r, make_plan
from checkmate.progress import ProgressCallback, SearchControl
from checkmate.strategies.checkpoint_all import checkpoint_all
from checkmate.strategies.common import EXACT_NODES
from checkmate.strategies.feasibility import infeasible_budget, message_time
from checkmate.strategies.registry import register
from checkmate.strategies.starts import starting_plans
from checkmate.strategies.warm_start import unproven_infeasibility
from checkmate.units import format_bytes

log = logging.getLogger(__name__)

METHOD = "optimal"
# backend="auto": the first installed of these. HiGHS solved every case of benchmarks/milp_backends.py (chains up
# to T = 129 and random graphs, warm-started) to optimality faster than SCIP; see BENCHMARKS.md. From
# PORTFOLIO_VARIABLES variables on, HiGHS and SCIP run side by side (neither wins on every real graph).
AUTO_ORDER = ("highs", "scip")
PORTFOLIO_VARIABLES = 20_000
# The share of the time left that `approx` may take before the MIP (it returns early when it has nothing left to
# try; its LP is also the LP bound).
APPROX_SHARE = 0.8


def choose_backend(name: str, num_variables: int = 0) -> str:
    """Resolve "auto" to a concrete, installed backend name (the portfolio for a problem this large)."""
    if name != "auto":
        return name
    installed = available_backends()
    if num_variables >= PORTFOLIO_VARIABLES and "portfolio" in installed:
        return "portfolio"
    return next((candidate for candidate in AUTO_ORDER if candidate in installed), AUTO_ORDER[0])


def check_backend_option(options: Mapping[str, Any]) -> None:
    """InvalidArgument unless `options["backend"]` (default "auto") names a known MILP backend or "auto"."""
    check_backend_name(options.get("backend", "auto"))


@register(
    METHOD,
    "the paper's MILP: the cheapest plan within the budget (proven optimal when the solver finishes)",
    check=check_backend_option,
)
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
    exact_nodes: int = EXACT_NODES,
    coarse_nodes: int | None = None,
    progress: ProgressCallback | None = None,
    control: SearchControl | None = None,
) -> Plan:
    """Solve the MILP for `graph` within `budget` bytes.

    Graphs of more than `exact_nodes` nodes are planned through a coarse graph (`checkmate.strategies.coarsened`:
    coarsen, solve this MILP on it, expand, improve on the full graph); the plan then reports the best lower bound
    proven for the graph given, and is "optimal" only when that bound meets its cost.

    Args:
        graph: the training graph.
        budget: bytes, fixed memory included; None means no limit (then checkpoint_all is optimal).
        backend: "auto", "highs", "scip" or "gurobi".
        time_limit: seconds for the whole call; on expiry the best plan found (never worse than the warm start).
        mip_gap: relative gap at which the solver stops and the plan counts as optimal.
        threads, verbose, seed: passed to the solver.
        warm_start: hand the best baseline plan to the solver as its first incumbent (it is the fallback either way).
        memory_resolution: at most this many memory units for the largest node (see checkmate.milp.scaling).
        exact_nodes: the largest graph solved as one MILP.
        coarse_nodes: blocks of the coarse graph for larger graphs (default: chosen from the time limit).
        progress: called with a `checkmate.progress.Progress` as the search goes.
        control: the clock and stop flag of a caller that already has one (then time_limit and progress are its).

    Raises:
        InfeasibleBudget: no schedule fits; the error names the smallest budget for which one exists.
    """
    control = control if control is not None else SearchControl(time_limit=time_limit, callback=progress)
    if budget is None:
        unlimited = checkpoint_all(graph, None)
        return make_plan(graph, unlimited.R, unlimited.S, method=METHOD, status="optimal", lower_bound=unlimited.cost)
    if budget < activation_floor(graph):
        raise infeasible_budget(graph, budget, method=METHOD, time_limit=message_time(control))
    settings = MilpSettings(backend, mip_gap, threads, verbose, seed, warm_start, memory_resolution)
    if graph.size > exact_nodes:
        from checkmate.strategies.coarsened import coarsened_optimal

        return coarsened_optimal(graph, budget, control, settings, blocks=coarse_nodes, method=METHOD)
    return solve_milp(graph, budget, control, settings, method=METHOD)


@dataclass(frozen=True)
class MilpSettings:
    """The solver options of `optimal`, handed on to the MILP of a coarse graph."""

    backend: str = "auto"
    mip_gap: float = 1e-4
    threads: int | None = None
    verbose: bool = False
    seed: int = 0
    warm_start: bool = True
    memory_resolution: int = DEFAULT_RESOLUTION
    recompute_backward: bool = True


def solve_milp(
    graph: Graph,
    budget: int,
    control: SearchControl,
    settings: MilpSettings,
    *,
    method: str,
    phase: str = "MILP",
    time_limit: float | None = None,
    proves: bool = True,
) -> Plan:
    """The paper's MILP on `graph`, warm-started from the best starting plan (`checkmate.strategies.starts`).

    Args:
        control: the call's clock, progress and stop flag.
        settings: solver options.
        method: the name the plan carries.
        phase: the name progress reports use.
        time_limit: seconds for this solve (default: what the control has left).
        proves: pass costs and bounds on to the control (False for a coarse graph, whose bound proves nothing
            about the graph the caller plans).
    """
    started = time.perf_counter()
    deadline = control.child(time_limit, reports=proves)
    starts = starting_plans(graph, budget, deadline, method=method, time_share=0.15)
    rounded = None if deadline.stopped else _rounded(graph, budget, deadline, settings.seed)
    fallback = min(
        (plan for plan in (starts.best, rounded) if plan is not None),
        key=lambda plan: (plan.cost, plan.peak_memory),
        default=None,
    )
    lp_bound = rounded.lower_bound if rounded is not None else None  # approx's LP: the paper's relaxation
    if lp_bound is not None:
        deadline.report(f"{phase}: LP bound", bound=lp_bound)
    first_bound = max(starts.bound, lp_bound or starts.bound)
    if fallback is not None and fallback.cost - first_bound <= settings.mip_gap * fallback.cost:
        log.info("the bound %.6g proves the starting plan optimal", first_bound)
        return final_plan(graph, budget, fallback, proven=True, bound=first_bound, started=started, method=method)
    scale = memory_scale(graph, settings.memory_resolution)
    problem, index = encode(
        graph,
        scale.budget_units(budget, graph.fixed_memory),
        scale,
        recompute_backward=settings.recompute_backward,
    )
    log.info(
        "MILP: %d variables, %d rows, %d nonzeros", problem.num_variables, problem.num_constraints, problem.num_nonzeros
    )
    remaining = deadline.remaining()
    options = SolveOptions(
        time_limit=None if remaining is None else max(1.0, remaining),
        mip_gap=settings.mip_gap,
        threads=settings.threads,
        verbose=settings.verbose,
        seed=settings.seed,
        on_progress=_reporter(deadline, phase, scale.exact),
        should_stop=lambda: deadline.stopped,
    )
    solution = get_backend(choose_backend(settings.backend, problem.num_variables)).solve(
        problem, options, _start(graph, problem, index, fallback) if settings.warm_start else None
    )
    if solution.status is SolveStatus.INFEASIBLE and scale.exact:
        raise infeasible_budget(graph, budget, method=method, time_limit=message_time(control))
    bounds = [b for b in (first_bound, solution.bound if scale.exact else None) if b is not None]
    plan = _best_plan(graph, budget, solution, index, fallback)
    if plan is None:
        raise _nothing_found(graph, budget, solution, deadline.time_limit, message_time(control), method)
    proven = (
        solution.status is SolveStatus.OPTIMAL and scale.exact and plan.cost <= (solution.objective or np.inf) + 1e-6
    )
    final = final_plan(
        graph, budget, plan, proven=proven, bound=max(bounds, default=None), started=started, method=method
    )
    deadline.report(phase, cost=final.cost, bound=final.lower_bound)
    return final


def _rounded(graph: Graph, budget: int, control: SearchControl, seed: int) -> Plan | None:
    """`approx` on this graph within a share of the time: its plan is a start, its LP bound a bound (so `optimal` is
    never worse than `approx`, which on small graphs often finds the optimum before the MIP does)."""
    from checkmate.strategies.approx import approx

    try:
        return approx(
            graph, budget, seed=seed, exact_nodes=graph.size, control=control.child(control.share(APPROX_SHARE))
        )
    except InfeasibleBudget as error:
        log.info("approx found no start: %s", error)
        return None


def _reporter(control: SearchControl, phase: str, exact: bool) -> Callable[[float | None, float | None], None]:
    """The solver's progress hook: its incumbent is a plan's cost; its bound counts only for an exact scaling."""

    def report(objective: float | None, bound: float | None) -> None:
        control.report(phase, cost=objective, bound=bound if exact else None)

    return report


def final_plan(
    graph: Graph, budget: int, plan: Plan, *, proven: bool, bound: float | None, started: float, method: str
) -> Plan:
    """The plan as the strategy returns it: its method, time since `started`, status and bound (capped at its cost)."""
    final = make_plan(
        graph,
        plan.R,
        plan.S,
        method=method,
        solve_time=time.perf_counter() - started,
        budget=budget,
        status="optimal" if proven else "feasible",
        lower_bound=None if bound is None else min(bound, plan.cost),
    )
    assert final.peak_memory <= budget, "a plan must fit the budget it was made for"
    return final


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


def _nothing_found(
    graph: Graph, budget: int, solution: MilpSolution, time_limit: float | None, time_left: float, method: str
) -> InfeasibleBudget:
    if solution.status is SolveStatus.INFEASIBLE:
        return infeasible_budget(graph, budget, method=method, time_limit=time_left)
    return unproven_infeasibility(
        graph,
        budget,
        f"{method}: no plan within {format_bytes(budget)} ({budget} bytes) was found in the time limit "
        f"({time_limit} s) and no baseline fits",
        "Raise time_limit or the budget",
    )
