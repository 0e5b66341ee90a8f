"""The exact search on one graph: the paper's MILP (eq. 9), warm-started from the best plan found before it.

Before the MIP: the starting plans (`checkmate.strategies.starts`: best baseline and the retention bound's answer,
each improved by hold_more) and `approx`'s LP rounding (`checkmate.strategies.lp_rounding`; its LP is the LP bound),
unless a start already meets the starts' bound (then it is the answer, proven optimal).
When a bound already meets the best start's cost (within `mip_gap`), that start is the answer without branching (this
formulation's LP and the retention bound are tight on chains). The MIP is warm-started from the best start, so the
search is never worse than the baselines or `approx` given the same time.

A time-limited solve never returns worse than that warm start. The search stops when a bound meets the plan within
`mip_gap`, or with `stall_time` once the gap has stopped closing (`checkmate.strategies.stall`), but the status is
"optimal" only when the bound meets its cost (`checkmate.plan.proven_status`; the MIP's own bound counts only on an
exactly scaled model); otherwise the plan's `gap` says how far it may be.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from checkmate.byte_sizes import format_bytes
from checkmate.errors import InfeasibleBudget
from checkmate.fetched import kept_throughout
from checkmate.graph import Graph
from checkmate.milp.backends import milp_backend
from checkmate.milp.formulation import (
    VariableIndex,
    decode,
    decode_plan_moves,
    decode_presence,
    encode,
    encode_solution,
)
from checkmate.milp.problem import MilpProblem, MilpSolution, SolveOptions, SolveStatus
from checkmate.milp.scaling import DEFAULT_RESOLUTION, memory_scale
from checkmate.options import SolverChoice
from checkmate.plan import Plan, cheapest_fitting, cheapest_r, make_plan
from checkmate.progress import SearchControl
from checkmate.strategies.common import final_plan
from checkmate.strategies.feasibility import infeasible_budget
from checkmate.strategies.held_start import HeldStart
from checkmate.strategies.lp_rounding import RoundingSettings, round_relaxation
from checkmate.strategies.policy import POLICY, SearchPolicy
from checkmate.strategies.stall import StallWatch
from checkmate.strategies.starts import starting_plans
from checkmate.strategies.warm_start import unproven_infeasibility

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class MilpSettings:
    """The solver options of `optimal`, handed on to the MILP of a coarse graph. `keeping_start`: on a graph with
    fetched values, start from the search that keeps every one of them (`_keeping_fetched_values`; off within that
    search, and on a coarse graph: its solve is short of time, and at a tight budget on Hugging Face's GPT-2 sharded
    over 2 ranks the start took the time the coarse MILP needed to find any plan)."""

    backend: SolverChoice = "auto"
    mip_gap: float = 1e-4
    threads: int | None = None
    verbose: bool = False
    seed: int = 0
    warm_start: bool = True
    memory_resolution: int = DEFAULT_RESOLUTION
    recompute_backward: bool = True
    stall_time: float | None = None
    keeping_start: bool = True


def solve_milp(
    graph: Graph,
    budget: int,
    control: SearchControl,
    settings: MilpSettings,
    *,
    method: str,
    message_time: float,
    phase: str = "MILP",
    policy: SearchPolicy = POLICY,
    extra_starts: Sequence[HeldStart] = (),
) -> Plan:
    """The paper's MILP on `graph` within `budget` bytes, warm-started (see the module doc), in `control`'s time.

    Args:
        control: the clock, progress and stop flag of this solve (a child that does not report, for a coarse graph
            whose bound proves nothing about the graph the caller plans).
        settings: solver options.
        method: the name the plan carries.
        message_time: seconds the error of an infeasible budget may spend finding the smallest budget (0: none).
        phase: the name progress reports use.
        extra_starts: starting plans given from outside the search, weighed with the baselines.
    """
    started = time.perf_counter()
    starts = starting_plans(
        graph,
        budget,
        control,
        method=method,
        time_share=policy.starts_share,
        message_time=message_time,
        policy=policy,
        extra_starts=extra_starts,
    )
    if starts.best is not None and policy.meets(starts.best.cost, starts.bound):
        # a proven optimum: no rounding or MILP can find a cheaper plan
        final = final_plan(graph, budget, starts.best, bound=starts.bound, started=started, method=method)
        log.info("the starting plan is %s (bound %.6g): no rounding, no MILP", final.describe(), starts.bound)
        return final
    scale = memory_scale(graph, settings.memory_resolution)
    problem, index = encode(
        graph,
        scale.budget_units(budget, graph.fixed_memory),
        scale,
        recompute_backward=settings.recompute_backward,
    )
    held = None
    if graph.fetched and settings.keeping_start and not control.stopped:
        keeping = control.child(control.share(policy.held_share), reports=False)
        held = _keeping_fetched_values(graph, budget, keeping, settings, method=method, policy=policy)
    rounding = control.child(_rounding_time(control, problem, policy))
    rounded = None if control.stopped else _rounded(graph, budget, rounding, settings.seed, policy)
    fallback = cheapest_fitting((starts.best, rounded, held), budget)
    lp_bound = rounded.lower_bound if rounded is not None else None  # approx's LP: the paper's relaxation
    if lp_bound is not None:
        control.report(f"{phase}: LP bound", bound=lp_bound)
    first_bound = max(starts.bound, lp_bound or starts.bound)
    if fallback is not None and policy.meets(fallback.cost, first_bound, settings.mip_gap):
        final = final_plan(graph, budget, fallback, bound=first_bound, started=started, method=method)
        log.info("the starting plan is %s (bound %.6g): no MILP", final.describe(), first_bound)
        return final
    log.info(
        "MILP: %d variables, %d rows, %d nonzeros", problem.num_variables, problem.num_constraints, problem.num_nonzeros
    )
    if control.stopped or policy.too_little_time(control.remaining(), problem.num_variables):
        log.info("%s: too little time left to load the MILP; the best start is the answer", phase)
        if fallback is None:
            raise _nothing_found(graph, budget, None, control.time_limit, message_time, method)
        return final_plan(graph, budget, fallback, bound=first_bound, started=started, method=method)
    stall = StallWatch(control, settings.stall_time)
    options = SolveOptions(
        time_limit=policy.solver_time_limit(control.remaining(), problem.num_variables),
        mip_gap=settings.mip_gap,
        threads=settings.threads,
        verbose=settings.verbose,
        seed=settings.seed,
        on_progress=_reporter(control, phase, scale.exact),
        should_stop=lambda: control.stopped or _within_gap(control, settings.mip_gap, policy) or stall.stalled(),
        interrupted=lambda: control.interrupted,
    )
    start = _start(graph, problem, index, fallback, policy) if settings.warm_start else None
    solution = milp_backend(settings.backend, problem.num_variables).solve(problem, options, start)
    if stall.stalled():
        log.info(
            "%s: the gap did not close in %.0f s (stall_time): stopped with the best plan", phase, settings.stall_time
        )
    if solution.status is SolveStatus.INFEASIBLE and scale.exact:
        raise infeasible_budget(graph, budget, method=method, time_limit=message_time)
    bounds = [b for b in (first_bound, solution.bound if scale.exact else None) if b is not None]
    plan = _best_plan(graph, budget, solution, index, fallback, method)
    if plan is None:
        raise _nothing_found(graph, budget, solution, control.time_limit, message_time, method)
    final = final_plan(graph, budget, plan, bound=max(bounds, default=None), started=started, method=method)
    control.report(phase, cost=final.cost, bound=final.lower_bound)
    return final


def _within_gap(control: SearchControl, gap: float, policy: SearchPolicy) -> bool:
    """Whether the best plan is proven within `gap` of the best bound known: the solver's own, or one proven before
    it (the starts' bounds, the LP), which the solver does not see and its own gap test ignores."""
    best, bound = control.best_cost, control.bound
    return best is not None and bound is not None and policy.meets(best, bound, gap)


def _keeping_fetched_values(
    graph: Graph, budget: int, control: SearchControl, settings: MilpSettings, *, method: str, policy: SearchPolicy
) -> Plan | None:
    """A start for a graph with fetched values: this search on the graph whose values are all kept from their first
    read to their end (`checkmate.fetched.kept_throughout`), so fetched once, priced on `graph`; None when it finds
    no plan. With the presence free, the MILP branches on it stage by stage: on a 154-node sharded step HiGHS and
    SCIP both spent a minute without finding what holding every unit and recomputing to make room gives (9.11 ms
    against 12.92 ms). With every value kept, the presence is fixed and the search is the paper's R and S alone,
    which it handles as well as ever; the free MILP after it still decides where fetching again is cheaper. It runs
    without the rounding, which would take its time before its MILP."""
    kept = dataclasses.replace(graph, fetched=kept_throughout(graph.fetched))
    if kept == graph:
        return None
    try:
        plan = solve_milp(
            kept, budget, control, dataclasses.replace(settings, keeping_start=False), method=method,
            message_time=0.0, phase="MILP keeping fetched values", policy=dataclasses.replace(policy, rounding_share=0),
        )  # fmt: skip
    except InfeasibleBudget:
        return None
    log.info("keeping every fetched value: cost %.6g", plan.cost)
    return make_plan(graph, plan.R, plan.S, method=method, presence=plan.presence, moves=plan.moves)


def _rounding_time(control: SearchControl, problem: MilpProblem, policy: SearchPolicy) -> float | None:
    """The rounding's time: `rounding_share` of what is left, or all of it when the rest would be too little to load
    the MILP (time the MILP cannot use goes to the rounding, whose plan is then the answer)."""
    share = control.share(policy.rounding_share)
    left = control.remaining()
    if share is None or left is None or not policy.too_little_time(left - share, problem.num_variables):
        return share
    log.info("too little time for the MILP after the rounding: the rounding gets all %.1f s left", left)
    return left


def _rounded(graph: Graph, budget: int, control: SearchControl, seed: int, policy: SearchPolicy) -> Plan | None:
    """`approx`'s rounding on this graph in `control`'s time: its plan is a start, its LP bound a bound (so the MILP
    search is never worse than `approx`, which on small graphs often finds the optimum before the MIP)."""
    try:
        return round_relaxation(
            graph,
            budget,
            control,
            RoundingSettings(seed=seed),
            method="approx",
            message_time=0.0,
            policy=policy,
        )
    except InfeasibleBudget as error:
        log.info("approx found no start: %s", error)
        return None


def _reporter(control: SearchControl, phase: str, exact: bool) -> Callable[[float | None, float | None], None]:
    """The solver's progress hook: its incumbent is a plan's cost; its bound counts only for an exact scaling."""

    def report(objective: float | None, bound: float | None) -> None:
        control.report(phase, cost=objective, bound=bound if exact else None)

    return report


def _start(
    graph: Graph, problem: MilpProblem, index: VariableIndex, fallback: Plan | None, policy: SearchPolicy
) -> np.ndarray | None:
    """The warm start vector of the fallback plan, when it satisfies the (unit-rounded) model. None for a graph with
    fetched values: HiGHS, given such a start, can report a better objective than the point it returns (seen with
    highspy 1.x on the small graphs of tests/solver/test_fetched.py)."""
    if fallback is None or graph.fetched:
        return None
    start = encode_solution(graph, index, fallback.R, fallback.S, fallback.presence, fallback.moves)
    violation = problem.max_violation(start)
    if violation > policy.solver_tolerance:
        log.info("the warm start %s breaks the unit-rounded model by %g; solving cold", fallback.method, violation)
        return None
    return start


def _best_plan(
    graph: Graph, budget: int, solution: MilpSolution, index: VariableIndex, fallback: Plan | None, method: str
) -> Plan | None:
    """The cheapest within budget of: the solver's plan, the same with R pruned to the cheapest for its S, and the
    fallback."""
    candidates = [fallback]
    if solution.x is not None:
        R, S = decode(solution.x, index)
        presence = decode_presence(solution.x, index)
        moves = decode_plan_moves(solution.x, index)
        candidates.append(make_plan(graph, R, S, method=method, presence=presence, moves=moves))
        if not moves.any:  # `cheapest_r` knows no copies back from host memory
            candidates.append(make_plan(graph, cheapest_r(graph, S), S, method=method, presence=presence))
    return cheapest_fitting(candidates, budget)


def _nothing_found(
    graph: Graph, budget: int, solution: MilpSolution | None, time_limit: float | None, time_left: float, method: str
) -> InfeasibleBudget:
    if solution is not None and solution.status is SolveStatus.INFEASIBLE:
        return infeasible_budget(graph, budget, method=method, time_limit=time_left)
    return unproven_infeasibility(
        graph,
        budget,
        f"{method}: no plan within {format_bytes(budget)} ({budget} bytes) was found in the time limit "
        f"({time_limit} s) and no baseline fits",
        "Raise time_limit or the budget",
        message_time=time_left,
    )
