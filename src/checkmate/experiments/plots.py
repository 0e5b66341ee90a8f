"""Pictures of plans: compute ratio against budget for every method, memory in use over a schedule, and R / S.

matplotlib is imported inside each function, so the rest of the package works without it
(`pip install checkmate-remat[plot]`).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from checkmate.experiments.sweep import SweepRow
from checkmate.files import write_figure
from checkmate.graph import Graph
from checkmate.plan import Plan, schedule_of

_MEBIBYTE = 2**20
_GIBIBYTE = 2**30


def _pyplot() -> Any:
    try:
        import matplotlib
    except ImportError:
        raise ImportError("plots need matplotlib: pip install 'checkmate-remat[plot]'") from None
    matplotlib.use("Agg")
    import matplotlib.pyplot as pyplot

    return pyplot


def _unit(largest: float) -> tuple[float, str]:
    if largest >= _GIBIBYTE:
        return _GIBIBYTE, "GiB"
    return (_MEBIBYTE, "MiB") if largest >= _MEBIBYTE else (1.0, "bytes")


def plot_sweep(rows: Sequence[SweepRow], path: str | Path, *, title: str = "") -> Path:
    """The compute ratio (cost / checkpoint_all's cost) against budget, one line per method and one panel per model (the
    paper's Figure 5); budgets where a method has no plan are gaps, and a method with no plan at all is left out."""
    pyplot = _pyplot()
    models = list(dict.fromkeys(row.model for row in rows))
    figure, panels = pyplot.subplots(1, len(models), figsize=(7 * len(models), 4.5), squeeze=False)
    for axes, model in zip(panels[0], models, strict=True):
        mine = sorted((row for row in rows if row.model == model), key=lambda row: row.budget)
        scale, unit = _unit(max(row.budget for row in mine))
        for method in dict.fromkeys(row.method for row in mine):
            theirs = [row for row in mine if row.method == method]
            if all(row.compute_ratio is None for row in theirs):
                continue
            budgets = [row.budget / scale for row in theirs]
            ratios = [np.nan if row.compute_ratio is None else row.compute_ratio for row in theirs]
            style = {"linewidth": 2.5, "color": "black"} if method == "optimal" else {"linewidth": 1.2}
            axes.plot(budgets, ratios, marker="o", markersize=3, label=method, **style)
        axes.set_xlabel(f"memory budget ({unit}, fixed memory included)")
        axes.set_ylabel("compute ratio (cost / checkpoint_all's)")
        axes.set_title(model)
        axes.grid(alpha=0.3)
        axes.legend(fontsize=8)
    figure.suptitle(title or "Compute ratio against memory budget")
    return _save(figure, pyplot, path)


def plot_memory(graph: Graph, plans: Sequence[Plan], path: str | Path, *, budget: int | None = None) -> Path:
    """Bytes in use just after each computation (the paper's U[t, k]) for each plan, with the budget as a line."""
    pyplot = _pyplot()
    schedules = [schedule_of(graph, plan) for plan in plans]
    scale, unit = _unit(max(schedule.peak_memory for schedule in schedules))
    figure, axes = pyplot.subplots(figsize=(8, 4))
    for plan, schedule in zip(plans, schedules, strict=True):
        usage = np.array(schedule.usage) / scale
        axes.plot(np.arange(usage.size), usage, linewidth=1, label=f"{plan.method} (cost {plan.cost:.4g})")
    if budget is not None:
        axes.axhline(budget / scale, color="red", linestyle="--", linewidth=1, label="budget")
    axes.set_xlabel("computation step")
    axes.set_ylabel(f"memory in use ({unit})")
    axes.set_title("Memory over the schedule")
    axes.grid(alpha=0.3)
    axes.legend(fontsize=8)
    return _save(figure, pyplot, path)


def plot_plan(plan: Plan, path: str | Path) -> Path:
    """The R and S matrices side by side (stage on the vertical axis, node on the horizontal), as in the paper."""
    pyplot = _pyplot()
    figure, (left, right) = pyplot.subplots(1, 2, figsize=(10, 5))
    for axes, matrix, name in ((left, plan.R, "R: computed in stage t"), (right, plan.S, "S: held into stage t")):
        axes.imshow(matrix, cmap="Greys", interpolation="nearest")
        axes.set_title(f"{name} ({plan.method})")
        axes.set_xlabel("node i")
        axes.set_ylabel("stage t")
    return _save(figure, pyplot, path)


def _save(figure: Any, pyplot: Any, path: str | Path) -> Path:
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    figure.tight_layout()
    write_figure(figure, target, dpi=120)
    pyplot.close(figure)
    return target
