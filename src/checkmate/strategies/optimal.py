"""optimal: the paper's MILP (eq. 9) solved by HiGHS, SCIP (or both at once) or Gurobi, warm-started.

Graphs of up to `SearchPolicy.exact_nodes` nodes are solved as one MILP (`checkmate.strategies.milp_search`); larger
ones through a coarse graph (`checkmate.strategies.large_graph`). A time-limited call never returns worse than the
best baseline or `approx` would in the same time, and `status` is "optimal" only when a bound proves it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from functools import partial
from typing import Any

from checkmate.bounds import activation_floor
from checkmate.fetched import fetch_bytes
from checkmate.graph import Graph
from checkmate.milp.backends import check_backend_name
from checkmate.milp.scaling import DEFAULT_RESOLUTION
from checkmate.options import SolverChoice
from checkmate.plan import Plan, make_plan
from checkmate.progress import ProgressCallback, SearchControl
from checkmate.strategies.checkpoint_all import checkpoint_all
from checkmate.strategies.feasibility import infeasible_budget, message_time
from checkmate.strategies.held_start import HeldStart
from checkmate.strategies.large_graph import Method, search
from checkmate.strategies.milp_search import MilpSettings, solve_milp
from checkmate.strategies.policy import POLICY, SearchPolicy
from checkmate.strategies.registry import register

METHOD = "optimal"


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
    backend: SolverChoice = "auto",
    time_limit: float | None = None,
    mip_gap: float = 1e-4,
    stall_time: float | None = None,
    threads: int | None = None,
    verbose: bool = False,
    seed: int = 0,
    warm_start: bool = True,
    memory_resolution: int = DEFAULT_RESOLUTION,
    exact_nodes: int | None = None,
    coarse_nodes: int | None = None,
    policy: SearchPolicy = POLICY,
    progress: ProgressCallback | None = None,
    control: SearchControl | None = None,
    extra_starts: Sequence[HeldStart] = (),
) -> Plan:
    """Solve the MILP for `graph` within `budget` bytes.

    Graphs of more than `exact_nodes` nodes are planned through a coarse graph (`checkmate.strategies.large_graph`:
    coarsen, solve this MILP on it, expand, improve on the full graph); the plan then reports the best lower bound
    proven for the graph given, and is "optimal" only when that bound meets its cost.

    Args:
        graph: the training graph.
        budget: bytes, fixed memory included; None means no limit (then checkpoint_all is optimal).
        backend: "auto", "highs", "scip", "portfolio" or "gurobi" ("auto": `checkmate.milp.backends.policy`).
        time_limit: seconds for the whole call; on expiry the best plan found (never worse than the warm start).
        mip_gap: relative gap to the lower bound at which the search stops (the plan's status is "optimal" only when
            the bound meets its cost; otherwise its `gap` says how close it is).
        stall_time: stop the MILP with its best plan once its gap has not closed for this many seconds
            (`checkmate.strategies.stall`); None: search until `mip_gap` or the time limit.
        threads, verbose, seed: passed to the solver.
        warm_start: hand the best baseline plan to the solver as its first incumbent (it is the fallback either way).
        memory_resolution: at most this many memory units for the largest node (see checkmate.milp.scaling).
        exact_nodes: the largest graph solved as one MILP (None: the policy's).
        coarse_nodes: nodes of the coarse graph for larger graphs (None: the policy's).
        policy: how the search spends its time (`checkmate.strategies.policy.SearchPolicy`).
        progress: called with a `checkmate.progress.Progress` as the search goes.
        control: the clock and stop flag of a caller that already has one (then time_limit and progress are its).
        extra_starts: starting plans given from outside (`checkmate.strategies.held_start.HeldStart`), weighed with
            the baselines: the plan returned costs at most the cheapest of them within the budget.

    Raises:
        InfeasibleBudget: no schedule fits; the error names the smallest budget for which one exists.
    """
    control = control if control is not None else SearchControl(time_limit=time_limit, callback=progress)
    if budget is None and not graph.fetched:
        unlimited = checkpoint_all(graph, None)
        return make_plan(graph, unlimited.R, unlimited.S, method=METHOD, status="optimal", lower_bound=unlimited.cost)
    if budget is None:  # fetched values: holding them costs memory, fetching them again time
        budget = checkpoint_all(graph, None).peak_memory + sum(map(fetch_bytes, graph.fetched))
    if budget < activation_floor(graph):
        raise infeasible_budget(graph, budget, method=METHOD, time_limit=message_time(control))
    policy = dataclasses.replace(
        policy,
        exact_nodes=policy.exact_nodes if exact_nodes is None else exact_nodes,
        coarse_nodes=policy.coarse_nodes if coarse_nodes is None else coarse_nodes,
    )
    settings = MilpSettings(
        backend, mip_gap, threads, verbose, seed, warm_start, memory_resolution, stall_time=stall_time
    )
    method = Method(
        name=METHOD,
        exact=partial(_milp, settings=settings, phase="MILP", extra_starts=tuple(extra_starts)),
        coarse=partial(
            _milp,
            settings=dataclasses.replace(settings, recompute_backward=False, keeping_start=False),
            phase="coarse MILP",
        ),
        gap=mip_gap,
        swap_holds=True,
        seed=seed,
        extra_starts=tuple(extra_starts),
    )
    return search(graph, budget, control, method, policy)


def _milp(
    graph: Graph,
    budget: int,
    control: SearchControl,
    message_time: float,
    *,
    settings: MilpSettings,
    phase: str,
    extra_starts: tuple[HeldStart, ...] = (),
) -> Plan:
    """`solve_milp` as `large_graph.Method` calls it. On a coarse graph the MILP computes each backward node once
    (a restriction that halves the model; optimal plans of real graphs rarely recompute them), and is given no
    `extra_starts` (they name the full graph's nodes)."""
    return solve_milp(
        graph,
        budget,
        control,
        settings,
        method=METHOD,
        message_time=message_time,
        phase=phase,
        extra_starts=extra_starts,
    )
