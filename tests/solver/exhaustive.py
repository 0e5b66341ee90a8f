"""Independent oracle: the cheapest plan at each budget by trying every useful S, with R = cheapest_r and `simulate`."""

from __future__ import annotations

import functools
import itertools

import numpy as np

from checkmate.graph import Graph
from checkmate.plan import cheapest_r
from checkmate.simulate import simulate


def useful_entries(graph: Graph) -> list[tuple[int, int]]:
    """S[t, i] with i < t <= last user of i: holding a value past its last use never helps."""
    entries = []
    for i, users in enumerate(graph.users):
        if users:
            entries.extend((t, i) for t in range(i + 1, users[-1] + 1))
    return entries


@functools.cache  # the search is exponential: every test module asking for the same graph shares one run
def cost_peak_frontier(graph: Graph) -> list[tuple[int, float]]:
    """Every (peak, cheapest cost at that peak or lower) step of the exhaustive search, sorted by peak."""
    entries = useful_entries(graph)
    best: dict[int, float] = {}
    for bits in itertools.product((False, True), repeat=len(entries)):
        S = np.zeros((graph.size, graph.size), dtype=bool)
        for (t, i), bit in zip(entries, bits, strict=True):
            S[t, i] = bit
        cost, peak = simulate(graph, cheapest_r(graph, S), S)
        best[peak] = min(best.get(peak, np.inf), cost)
    frontier = []
    running = np.inf
    for peak in sorted(best):
        running = min(running, best[peak])
        frontier.append((peak, running))
    return frontier


def cheapest_at(frontier: list[tuple[int, float]], budget: int) -> float | None:
    """The oracle's optimum within `budget`, or None when no schedule fits."""
    costs = [cost for peak, cost in frontier if peak <= budget]
    return min(costs) if costs else None
