"""Pictures of plans: overhead against budget for every method, memory in use over a schedule, and R / S.

matplotlib is imported inside each function, so the rest of the package works without it
(`pip install checkmate-remat[plot]`).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from checkmate.graph import Graph
from checkmate.plan import Plan
from checkmate.simulate import lower
from checkmate.sweep import SweepPoint

_MEBIBYTE = 2**20


def _pyplot() -> Any:
    try:
        import matplotlib
    except ImportError:
        raise ImportError("plots need matplotlib: pip install 'checkmate-remat[plot]'") from None
    matplotlib.use("Agg")
    import matplotlib.pyplot as pyplot

    return pyplot


def _unit(largest: float) -> tuple[float, str]:
    return (_MEBIBYTE, "MiB") if largest >= _MEBIBYTE else (1.0, "bytes")


def plot_sweep(points: Sequence[SweepPoint], path: str | Path, *, title: str = "") -> Path:
    """Overhead (cost / checkpoint_all cost) against budget, one line per method; infeasible budgets are gaps."""
    pyplot = _pyplot()
    scale, unit = _unit(max(point.budget for point in points))
    figure, axes = pyplot.subplots(figsize=(7, 4.5))
    for method in dict.fromkeys(point.row.method for point in points):
        mine = [point for point in points if point.row.method == method]
        budgets = [point.budget / scale for point in mine]
        overheads = [np.nan if point.row.overhead is None else point.row.overhead for point in mine]
        style = {"linewidth": 2.5, "color": "black"} if method == "optimal" else {"linewidth": 1.2}
        axes.plot(budgets, overheads, marker="o", markersize=3, label=method, **style)
    axes.set_xlabel(f"memory budget ({unit}, fixed memory included)")
    axes.set_ylabel("compute overhead (× checkpoint_all)")
    axes.set_title(title or "Overhead against memory budget")
    axes.grid(alpha=0.3)
    axes.legend(fontsize=8)
    return _save(figure, pyplot, path)


def plot_memory(graph: Graph, plans: Sequence[Plan], path: str | Path, *, budget: int | None = None) -> Path:
    """Bytes in use just after each computation (the paper's U[t, k]) for each plan, with the budget as a line."""
    pyplot = _pyplot()
    schedules = [lower(graph, plan.R, plan.S) for plan in plans]
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
    figure.savefig(target, dpi=120)
    pyplot.close(figure)
    return target
