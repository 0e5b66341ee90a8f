"""Budget sweeps: every method at a range of budgets, the paper's compute-against-memory comparison (its Figure 5).

A sweep is a list of independent solves, `SweepTask`s (one graph, budget and method each), each turned into a
`SweepRow` by `solve_task`; a `checkmate.experiments.parallel` runner decides where they run (this process by
default, worker processes or a Ray cluster on request). Rows of several models can share one runner, and they save
to and load from JSON (`rows_to_json`, `rows_from_json`). `checkmate.experiments.tables` turns rows into the
paper's Table 2.

    rows = sweep(graph, budget_grid(graph, 8), ["chen_greedy", "optimal"], options={"time_limit": 30})
"""

from __future__ import annotations

import dataclasses
import json
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, TypeAlias

import numpy as np

from checkmate.errors import EXPECTED_FAILURES, InfeasibleBudget, InvalidArgument
from checkmate.experiments.compare import REFERENCE, accepted_options
from checkmate.experiments.parallel import LocalRunner, Runner
from checkmate.graph import Graph
from checkmate.milp.formulation import build_index
from checkmate.milp.scaling import memory_scale
from checkmate.plan import PlanStatus
from checkmate.solve import solve
from checkmate.strategies.registry import get_strategy, strategies_for
from checkmate.strategies.warm_start import lowest_peak_baseline

log = logging.getLogger(__name__)

SweepStatus: TypeAlias = PlanStatus | Literal["infeasible", "error"]
"""A row's status: its plan's, or why it has none."""
INFEASIBLE: SweepStatus = "infeasible"
ERROR: SweepStatus = "error"


@dataclass(frozen=True)
class SweepRow:
    """One method's result at one budget on one model.

    Attributes:
        model: the model's (or graph file's) name.
        method: the strategy's name.
        budget: the budget in bytes, fixed memory included.
        cost: the plan's compute cost, or None without a plan.
        peak_memory: the plan's peak in bytes (fixed memory included), or None without a plan.
        compute_ratio: cost divided by checkpoint_all's cost (no recomputation), or None.
        status: the plan's ("optimal": proven; "feasible"), "infeasible" (the method has no plan within the budget;
            for a search, none found in its time) or "error" (the method cannot handle the graph).
        seconds: wall-clock seconds of the solve, where it ran.
        lower_bound: a proven lower bound on the cost of any plan within the budget, when the method gives one.
        gap: (cost - lower_bound) / cost, when known.
        error: the method's message when it gave no plan.
        nodes: the graph's nodes (the MILP's stages T).
        variables: variables of the paper's MILP (eq. 9) on the full graph, as `checkmate.milp.formulation` builds
            it (graphs above `optimal`'s exact_nodes are solved through a smaller, coarse MILP).
    """

    model: str
    method: str
    budget: int
    cost: float | None
    peak_memory: int | None
    compute_ratio: float | None
    status: SweepStatus
    seconds: float
    lower_bound: float | None = None
    gap: float | None = None
    error: str | None = None
    nodes: int = 0
    variables: int = 0


@dataclass(frozen=True)
class SweepTask:
    """One solve of a sweep; picklable, so it can run in another process or on another machine.

    Attributes:
        model: the name its row carries.
        graph: the training graph.
        budget: bytes, fixed memory included.
        method: a registered method.
        options: the options this method takes (time_limit, backend, ...); no callbacks.
        reference_cost: checkpoint_all's cost on the graph, the denominator of the compute ratio.
        variables: the MILP size its row carries.
    """

    model: str
    graph: Graph
    budget: int
    method: str
    options: Mapping[str, Any] = field(default_factory=dict)
    reference_cost: float = 0.0
    variables: int = 0


def solve_task(task: SweepTask) -> SweepRow:
    """Solve one task; a method with no plan within the budget, or that cannot handle the graph, gives a row saying
    so (status "infeasible" or "error", with the message) instead of raising."""
    started = time.perf_counter()
    try:
        plan = solve(task.graph, task.budget, method=task.method, **task.options)
    except EXPECTED_FAILURES as error:
        log.info("%s %s at %d bytes: %s", task.model, task.method, task.budget, error)
        return SweepRow(
            task.model,
            task.method,
            task.budget,
            cost=None,
            peak_memory=None,
            compute_ratio=None,
            status=INFEASIBLE if isinstance(error, InfeasibleBudget) else ERROR,
            seconds=time.perf_counter() - started,
            error=str(error),
            nodes=task.graph.size,
            variables=task.variables,
        )
    return SweepRow(
        task.model,
        task.method,
        task.budget,
        cost=plan.cost,
        peak_memory=plan.peak_memory,
        compute_ratio=plan.cost / task.reference_cost if task.reference_cost > 0 else None,
        status=plan.status,
        seconds=plan.solve_time,
        lower_bound=plan.lower_bound,
        gap=plan.gap,
        nodes=task.graph.size,
        variables=task.variables,
    )


def budget_grid(graph: Graph, points: int) -> list[int]:
    """`points` budgets evenly spaced from the lowest peak any baseline reaches to checkpoint_all's peak.

    Every budget has at least one plan, and the grid depends on the graph alone, never on the time a search was given
    or the machine it ran on: two runs of a sweep (in this process, in worker processes or on Ray) compare the same
    budgets. The search for the smallest budget (`checkmate.minimum_budget`) rarely proves it on graphs of more than a
    few dozen nodes and ends where its time limit does, so what it finds depends on the machine and the grid does not
    use it; to sweep below the baselines, pass `sweep` budgets from the range it finds.
    """
    if points < 2:
        raise InvalidArgument(f"a sweep needs at least 2 budgets, got {points}")
    top = solve(graph, None, method=REFERENCE).peak_memory
    lowest = lowest_peak_baseline(graph)
    bottom = top if lowest is None else min(lowest.peak_memory, top)
    return sorted({int(budget) for budget in np.linspace(bottom, top, points).round()})


def milp_variables(graph: Graph) -> int:
    """Variables of the paper's MILP (eq. 9) for `graph`, as `checkmate.milp.formulation` numbers them."""
    return build_index(graph, memory_scale(graph), np.inf).num_variables


def sweep_tasks(
    model: str,
    graph: Graph,
    budgets: Sequence[int],
    methods: Sequence[str] | None = None,
    options: Mapping[str, Any] | None = None,
) -> list[SweepTask]:
    """One task per budget and method (default: every registered method); each gets only the options it takes."""
    names = list(methods) if methods is not None else [strategy.name for strategy in strategies_for(graph)]
    for name in names:
        get_strategy(name)
    reference_cost = solve(graph, None, method=REFERENCE).cost
    variables = milp_variables(graph)
    return [
        SweepTask(model, graph, int(budget), name, accepted_options(name, options or {}), reference_cost, variables)
        for budget in budgets
        for name in names
    ]


def sweep(
    graph: Graph,
    budgets: Sequence[int],
    methods: Sequence[str] | None = None,
    *,
    options: Mapping[str, Any] | None = None,
    model: str = "graph",
    runner: Runner | None = None,
    on_row: Callable[[SweepRow], None] | None = None,
) -> list[SweepRow]:
    """Run each method at each budget on `graph`.

    Args:
        graph: the training graph.
        budgets: bytes, fixed memory included (`budget_grid` makes an even grid).
        methods: registered method names; default every one.
        options: options for the methods that take them (time_limit, ...); each method gets the ones it takes.
            They travel to the workers, so no callbacks (progress shows through `on_row`).
        model: the name the rows carry.
        runner: where the solves run (`checkmate.experiments.parallel`); default one by one in this process.
        on_row: called with each row as it finishes.

    Returns:
        One row per budget and method, budget-major, in the order asked.
    """
    tasks = sweep_tasks(model, graph, budgets, methods, options)
    return run_tasks(tasks, runner, on_row)


def sweep_models(
    graphs: Mapping[str, Graph],
    points: int,
    methods: Sequence[str] | None = None,
    *,
    options: Mapping[str, Any] | None = None,
    runner: Runner | None = None,
    on_row: Callable[[SweepRow], None] | None = None,
) -> list[SweepRow]:
    """Sweep several models over `points` budgets each (`budget_grid`), all their solves in one runner."""
    tasks = [
        task
        for model, graph in graphs.items()
        for task in sweep_tasks(model, graph, budget_grid(graph, points), methods, options)
    ]
    return run_tasks(tasks, runner, on_row)


def run_tasks(
    tasks: Sequence[SweepTask], runner: Runner | None = None, on_row: Callable[[SweepRow], None] | None = None
) -> list[SweepRow]:
    """Solve the tasks with `runner` (default: in this process); rows in task order."""
    return (runner or LocalRunner(workers=1)).map(solve_task, tasks, on_row)


def rows_to_json(rows: Sequence[SweepRow]) -> str:
    """The rows as a JSON list of objects (budget and peak in bytes, seconds wall-clock)."""
    return json.dumps([dataclasses.asdict(row) for row in rows], indent=1)


def rows_from_json(text: str) -> list[SweepRow]:
    """Rows saved by `rows_to_json` (`checkmate sweep --out`)."""
    try:
        data = json.loads(text)
        return [SweepRow(**item) for item in data]
    except (json.JSONDecodeError, TypeError) as error:
        advice = "write one with `checkmate sweep ... --out rows.json`"
        raise InvalidArgument(f"not a list of sweep rows ({error}); {advice}") from None
