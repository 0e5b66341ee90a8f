"""Memory in solver units: sizes rounded up and the budget rounded down, so a plan that fits in units fits in bytes.

Raw byte counts (4 B ... 4 MB in one row) stall the LP. The unit is the greatest common divisor of the node
sizes and workspaces when that keeps the largest within `resolution` units (then the scaling is exact);
otherwise it is ceil(largest / resolution) and every size is rounded up to whole units (then the MILP optimises
a slightly tighter problem, and its proven bound no longer bounds the byte problem: `exact` is False).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from checkmate.fetched import fetched_amounts
from checkmate.graph import Graph

DEFAULT_RESOLUTION = 4096


@dataclass(frozen=True)
class MemoryScale:
    """How bytes map to solver units.

    Attributes:
        unit: bytes per unit.
        sizes: int64[T], each node's size in units, rounded up.
        exact: True when every size and workspace is a whole number of units (no rounding happened).
        workspace: int64[T], each node's workspace in units, rounded up like the sizes.
        recompute_workspace: int64[T], each node's recompute workspace in units, rounded up.
        retained_before: int64[T], what nodes 0..t-1 retain (`Graph.retained`) in units, rounded up: held in stage t
            until node t first runs.
        retained_through: int64[T], the same for nodes 0..t: held from the moment node t first runs.
        opening: int64[T], what the graph holds outside the plan only at the start of each stage
            (`Graph.opening_held`), in units, rounded up.
        fetched_sizes: int64[F], each fetched value's bytes in units, rounded like the sizes (`Graph.fetched`).
        fetch_workspace: int64[F], the bytes each value's fetch holds beside it, in units, rounded like the sizes.
        in_flight_workspace: int64[F], the bytes each value's prefetch holds beside its buffer, in units, rounded
            like the sizes.
    """

    unit: int
    sizes: np.ndarray
    exact: bool
    workspace: np.ndarray
    recompute_workspace: np.ndarray
    retained_before: np.ndarray
    retained_through: np.ndarray
    opening: np.ndarray
    fetched_sizes: np.ndarray
    fetch_workspace: np.ndarray
    in_flight_workspace: np.ndarray

    def retained_at(self, stage: np.ndarray, node: np.ndarray) -> np.ndarray:
        """Units retained while node k runs in stage t (k <= t), for arrays of (t, k): node t's own from its run."""
        return np.where(node == stage, self.retained_through[stage], self.retained_before[stage])

    def budget_units(self, budget: int, fixed_memory: int) -> int:
        """The activation budget in units, rounded down: sum(sizes) <= this implies bytes <= budget - fixed."""
        return (budget - fixed_memory) // self.unit

    def to_bytes(self, units: float, fixed_memory: int) -> int:
        """A peak in units back to bytes, fixed memory included."""
        return round(units) * self.unit + fixed_memory


def memory_scale(graph: Graph, resolution: int = DEFAULT_RESOLUTION) -> MemoryScale:
    """Choose the unit for `graph`: exact (GCD) when it keeps sizes within `resolution`, else rounded up."""
    fetched, fetch_workspace, in_flight = fetched_amounts(graph.fetched)
    amounts = np.concatenate(
        [
            graph.memory,
            graph.workspace,
            graph.recompute_workspace,
            graph.retained,
            graph.held_at_opening,
            fetched,
            fetch_workspace,
            in_flight,
        ]
    )
    positive = amounts[amounts > 0]
    divisor = math.gcd(*(int(size) for size in np.unique(positive))) if positive.size else 1
    largest = int(positive.max()) if positive.size else 0
    unit = divisor if largest // divisor <= resolution else math.ceil(largest / resolution)
    through = graph.retained_through
    before = through - graph.retained
    return MemoryScale(
        unit=unit,
        sizes=(-(-graph.memory // unit)).astype(np.int64),
        exact=bool(np.all(amounts % unit == 0)),
        workspace=(-(-graph.workspace // unit)).astype(np.int64),
        recompute_workspace=(-(-graph.recompute_workspace // unit)).astype(np.int64),
        retained_before=(-(-before // unit)).astype(np.int64),
        retained_through=(-(-through // unit)).astype(np.int64),
        opening=(-(-graph.held_at_opening // unit)).astype(np.int64),
        fetched_sizes=(-(-fetched // unit)).astype(np.int64),
        fetch_workspace=(-(-fetch_workspace // unit)).astype(np.int64),
        in_flight_workspace=(-(-in_flight // unit)).astype(np.int64),
    )


def relaxed_scale(scale: MemoryScale, graph: Graph) -> MemoryScale:
    """Sizes rounded down instead of up: a relaxation whose proven bounds are valid for the byte problem."""
    if scale.exact:
        return scale
    through = graph.retained_through
    before = through - graph.retained
    fetched, fetch_workspace, in_flight = fetched_amounts(graph.fetched)
    return MemoryScale(
        unit=scale.unit,
        sizes=graph.memory // scale.unit,
        exact=False,
        workspace=graph.workspace // scale.unit,
        recompute_workspace=graph.recompute_workspace // scale.unit,
        retained_before=before // scale.unit,
        retained_through=through // scale.unit,
        opening=graph.held_at_opening // scale.unit,
        fetched_sizes=fetched // scale.unit,
        fetch_workspace=fetch_workspace // scale.unit,
        in_flight_workspace=in_flight // scale.unit,
    )
