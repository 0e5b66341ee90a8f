"""Budget sweeps: every method at a range of budgets, the paper's overhead-against-memory comparison (its Figure 5)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from checkmate.bounds import activation_floor
from checkmate.compare import ComparisonRow, compare
from checkmate.graph import Graph
from checkmate.solve import solve


@dataclass(frozen=True)
class SweepPoint:
    """One method's result at one budget."""

    budget: int
    row: ComparisonRow


def budget_grid(graph: Graph, points: int) -> list[int]:
    """`points` budgets evenly spaced from the activation floor (no schedule peaks lower) to checkpoint_all's peak."""
    if points < 2:
        raise ValueError(f"a sweep needs at least 2 budgets, got {points}")
    top = solve(graph, None, method="checkpoint_all").peak_memory
    bottom = min(activation_floor(graph), top)
    return sorted({int(budget) for budget in np.linspace(bottom, top, points).round()})


def sweep(
    graph: Graph,
    budgets: Sequence[int],
    methods: Sequence[str] | None = None,
    *,
    options: Mapping[str, Any] | None = None,
) -> list[SweepPoint]:
    """Run `compare` at each budget; methods that cannot meet a budget give rows with status "error"."""
    return [SweepPoint(budget, row) for budget in budgets for row in compare(graph, budget, methods, options=options)]
