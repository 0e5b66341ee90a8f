"""Run several strategies on one graph and budget, and tabulate cost, compute ratio and peak (the paper's
comparison)."""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from checkmate.byte_sizes import format_bytes, parse_bytes
from checkmate.errors import EXPECTED_FAILURES
from checkmate.graph import Graph
from checkmate.plan import PlanStatus
from checkmate.solve import solve
from checkmate.strategies.registry import get_strategy, option_names, strategies_for

log = logging.getLogger(__name__)

REFERENCE = "checkpoint_all"


@dataclass(frozen=True)
class ComparisonRow:
    """One method's result on the compared graph.

    Attributes:
        method: the strategy's name.
        cost: the plan's compute cost, or None when the method failed.
        peak_memory: the plan's peak in bytes (fixed memory included), or None when it failed.
        compute_ratio: cost divided by checkpoint_all's cost (the cost with no recomputation), or None.
        solve_time: seconds the method took.
        status: the plan's status ("optimal" or "feasible"), or "error" when the method raised.
        error: the error's one-line message when the method failed (infeasible budget, graph it cannot handle).
    """

    method: str
    cost: float | None
    peak_memory: int | None
    compute_ratio: float | None
    solve_time: float
    status: PlanStatus | Literal["error"]
    error: str | None = None


def compare(
    graph: Graph,
    budget: int | float | str | None,
    methods: Sequence[str] | None = None,
    *,
    options: Mapping[str, Any] | None = None,
) -> list[ComparisonRow]:
    """Solve `graph` within `budget` with each method and report cost, compute ratio to checkpoint_all, and peak.

    Args:
        graph: the training graph.
        budget: bytes or a string such as "512MiB" (fixed memory included), or None for no limit.
        methods: names of registered methods; default every registered method, in registration order.
        options: options handed to each method whose function takes them by name (for example time_limit).

    Returns:
        One row per method, in the order asked. A method that cannot meet the budget or cannot handle the graph
        gives a row with status "error" and the message, instead of raising.

    Example:
        >>> from checkmate.examples import linear_graph
        >>> print(format_table(compare(linear_graph(8), 6, ["checkpoint_all", "chen_sqrtn"])))  # doctest: +SKIP
    """
    budget_bytes = None if budget is None else parse_bytes(budget)
    names = list(methods) if methods is not None else [strategy.name for strategy in strategies_for(graph)]
    for name in names:
        get_strategy(name)
    reference_cost = solve(graph, None, method=REFERENCE).cost
    return [_run(graph, budget_bytes, name, options=dict(options or {}), reference=reference_cost) for name in names]


def _run(graph: Graph, budget: int | None, method: str, *, options: dict[str, Any], reference: float) -> ComparisonRow:
    accepted = accepted_options(method, options)
    started = time.perf_counter()
    try:
        plan = solve(graph, budget, method=method, **accepted)
    except EXPECTED_FAILURES as error:
        log.info("%s failed: %s", method, error)
        return ComparisonRow(method, None, None, None, time.perf_counter() - started, "error", str(error))
    compute_ratio = plan.cost / reference if reference > 0 else None
    return ComparisonRow(method, plan.cost, plan.peak_memory, compute_ratio, plan.solve_time, plan.status)


def accepted_options(method: str, options: Mapping[str, Any]) -> dict[str, Any]:
    """The options the method's function takes after (graph, budget) (all of them if it takes **kwargs)."""
    names = option_names(method)
    if names is None:
        return dict(options)
    return {key: value for key, value in options.items() if key in names}


def format_table(rows: Sequence[ComparisonRow]) -> str:
    """A plain-text table: method, cost, compute ratio, peak (human and bytes), solve time, status or error."""
    header = ("method", "cost", "compute ratio", "peak", "peak bytes", "time (s)", "status")
    lines = [header]
    for row in rows:
        if row.cost is None or row.peak_memory is None:
            lines.append((row.method, "-", "-", "-", "-", f"{row.solve_time:.2f}", f"error: {row.error}"))
            continue
        ratio = "-" if row.compute_ratio is None else f"{row.compute_ratio:.3f}x"
        peak = (format_bytes(row.peak_memory), str(row.peak_memory))
        lines.append((row.method, f"{row.cost:.6g}", ratio, *peak, f"{row.solve_time:.2f}", row.status))
    widths = [max(len(line[column]) for line in lines) for column in range(len(header) - 1)]
    rendered = [
        "  ".join(cell.ljust(width) for cell, width in zip(line[:-1], widths, strict=True)) + "  " + line[-1]
        for line in lines
    ]
    return "\n".join(text.rstrip() for text in rendered)
