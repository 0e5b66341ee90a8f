"""Tables over sweep rows (`checkmate.experiments.sweep.SweepRow`): compute ratio per budget, the paper's Table 2, and
solve times.

* `format_sweep`: per model, one line per budget and one column per method, the compute ratio to checkpoint_all
  ("-" where the method has no plan, "*" where the plan is proven optimal).
* `approximation_ratios` / `format_table2`: the paper's Table 2, each method's cost relative to a reference method
  (`optimal`), as the geometric mean over the budgets at which both have a plan, per model.
* `solve_times` / `format_solve_times`: per model and method, the graph's nodes, the MILP's variables, how many
  budgets got a plan and how many were proven optimal, the median and largest solve time, and the largest gap.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass

from checkmate.byte_sizes import format_bytes
from checkmate.experiments.compare import REFERENCE
from checkmate.experiments.sweep import SweepRow

OPTIMAL = "optimal"


@dataclass(frozen=True)
class Ratio:
    """One cell of Table 2: a method's cost over the reference's cost on one model.

    Attributes:
        model: the model.
        method: the method compared.
        geomean: the geometric mean of cost / reference cost over `budgets`, or None when there are none.
        maximum: the largest of those ratios, or None.
        budgets: how many budgets both the method and the reference have a plan for.
    """

    model: str
    method: str
    geomean: float | None
    maximum: float | None
    budgets: int


@dataclass(frozen=True)
class SolveTimes:
    """A model's graph size and a method's solve times over a sweep.

    Attributes:
        model, method: what was solved.
        nodes: the graph's nodes.
        variables: the paper's MILP variables on that graph (`SweepRow.variables`).
        budgets: budgets tried.
        plans: budgets the method found a plan for.
        proven: plans proven optimal.
        median_seconds, max_seconds: over every budget tried, with or without a plan.
        max_gap: the largest relative gap among the plans that report one, or None.
    """

    model: str
    method: str
    nodes: int
    variables: int
    budgets: int
    plans: int
    proven: int
    median_seconds: float
    max_seconds: float
    max_gap: float | None


def _models(rows: Sequence[SweepRow]) -> list[str]:
    return list(dict.fromkeys(row.model for row in rows))


def _methods(rows: Sequence[SweepRow]) -> list[str]:
    return list(dict.fromkeys(row.method for row in rows))


def approximation_ratios(
    rows: Sequence[SweepRow], reference: str = OPTIMAL, methods: Sequence[str] | None = None
) -> list[Ratio]:
    """Table 2: for each model and method, cost / reference cost at every budget where both have a plan, summarised
    as the geometric mean and the maximum (the paper's caption: "the geometric mean ... across feasible budgets").

    Args:
        rows: sweep rows of one or more models; models without `reference` rows are left out.
        reference: the method divided by; its plans count whether proven optimal or not (`solve_times` says how
            many were proven).
        methods: the methods compared; default every method in the rows but the reference and checkpoint_all
            (which has a plan only where nothing is recomputed, as the paper's table leaves it out).
    """
    ratios = []
    for model in _models(rows):
        mine = [row for row in rows if row.model == model]
        if not any(row.method == reference for row in mine):
            continue
        best = {row.budget: row.cost for row in mine if row.method == reference and row.cost is not None}
        for method in methods if methods is not None else _methods(mine):
            if methods is None and method in (reference, REFERENCE):
                continue
            values = [
                row.cost / best[row.budget]
                for row in mine
                if row.method == method and row.cost is not None and best.get(row.budget, 0.0) > 0
            ]
            geomean = math.exp(statistics.fmean(math.log(value) for value in values)) if values else None
            ratios.append(Ratio(model, method, geomean, max(values, default=None), len(values)))
    return ratios


def format_table2(ratios: Sequence[Ratio], reference: str = OPTIMAL) -> str:
    """Table 2 as text: a row per model, a column per method, each cell "geomean× (budgets)"."""
    methods = list(dict.fromkeys(ratio.method for ratio in ratios))
    cells = {(ratio.model, ratio.method): ratio for ratio in ratios}
    header = ["model", *methods]
    lines = [header]
    for model in dict.fromkeys(ratio.model for ratio in ratios):
        line = [model]
        for method in methods:
            ratio = cells.get((model, method))
            line.append("-" if ratio is None or ratio.geomean is None else f"{ratio.geomean:.2f}x ({ratio.budgets})")
        lines.append(line)
    note = f"(cost / {reference} cost, geometric mean over the budgets where both have a plan; their count in ())"
    return _render(lines) + "\n" + note


def solve_times(rows: Sequence[SweepRow]) -> list[SolveTimes]:
    """Per model and method: graph size, plans found and proven, solve time (median, max) and largest gap."""
    table = []
    for model in _models(rows):
        mine = [row for row in rows if row.model == model]
        for method in _methods(mine):
            theirs = [row for row in mine if row.method == method]
            seconds = [row.seconds for row in theirs]
            gaps = [row.gap for row in theirs if row.gap is not None]
            table.append(
                SolveTimes(
                    model=model,
                    method=method,
                    nodes=theirs[0].nodes,
                    variables=theirs[0].variables,
                    budgets=len(theirs),
                    plans=sum(row.cost is not None for row in theirs),
                    proven=sum(row.status == OPTIMAL for row in theirs),
                    median_seconds=statistics.median(seconds),
                    max_seconds=max(seconds),
                    max_gap=max(gaps, default=None),
                )
            )
    return table


def format_solve_times(table: Sequence[SolveTimes]) -> str:
    """The solve-time table as text."""
    lines = [["model", "method", "nodes", "variables", "plans", "proven", "median s", "max s", "max gap"]]
    for entry in table:
        lines.append(
            [
                entry.model,
                entry.method,
                str(entry.nodes),
                str(entry.variables),
                f"{entry.plans}/{entry.budgets}",
                str(entry.proven),
                f"{entry.median_seconds:.2f}",
                f"{entry.max_seconds:.2f}",
                "-" if entry.max_gap is None else f"{entry.max_gap:.2%}",
            ]
        )
    return _render(lines, left=2)


def format_sweep(rows: Sequence[SweepRow]) -> str:
    """Per model, the compute ratio of each method at each budget; "-" no plan, "*" proven optimal."""
    blocks = []
    for model in _models(rows):
        mine = [row for row in rows if row.model == model]
        methods = _methods(mine)
        cells = {(row.budget, row.method): row for row in mine}
        lines = [["budget", "bytes", *methods]]
        for budget in sorted({row.budget for row in mine}):
            line = [format_bytes(budget), str(budget)]
            for method in methods:
                row = cells.get((budget, method))
                if row is None or row.compute_ratio is None:
                    line.append("-")
                else:
                    line.append(f"{row.compute_ratio:.3f}x" + ("*" if row.status == OPTIMAL else ""))
            lines.append(line)
        blocks.append(f"{model} ({mine[0].nodes} nodes)\n" + _render(lines))
    note = "(compute ratio: cost over checkpoint_all's; - no plan within the budget; * proven optimal)"
    return "\n\n".join(blocks) + "\n" + note


def _render(lines: Sequence[Sequence[str]], left: int = 1) -> str:
    """Columns aligned: the first `left` to the left (text), the rest to the right (numbers)."""
    widths = [max(len(line[column]) for line in lines) for column in range(len(lines[0]))]
    rendered = []
    for line in lines:
        cells = [
            cell.ljust(width) if column < left else cell.rjust(width)
            for column, (cell, width) in enumerate(zip(line, widths, strict=True))
        ]
        rendered.append("  ".join(cells).rstrip())
    return "\n".join(rendered)
