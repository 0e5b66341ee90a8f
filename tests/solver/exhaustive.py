"""Independent oracle: the cheapest plan at each budget by exhaustive search, priced by the paper's equations.

Nothing here calls the library's planning code (`cheapest_r`, `simulate`, `lower`): each candidate S gets the
fewest computations the paper's constraints allow, derived here from (1b), (1c) and (8a), every candidate is checked
against the constraints, and cost and peak come from `oracles.paper_cost_and_peak` (eqs. 1a, 2-5).

Two restrictions keep the search small, and `full_frontier` (every R and S on the tiniest graphs) checks that they
lose nothing: S is only tried where a value is held past its own stage and up to its last user, and R is the
smallest one S allows (computing more never lowers the cost, and never frees memory sooner).
"""

from __future__ import annotations

import functools
import itertools

import numpy as np
from oracles import moved_cost_and_usage, paper_cost_and_peak

from checkmate.graph import Graph
from checkmate.moved import Moves


def useful_entries(graph: Graph) -> list[tuple[int, int]]:
    """S[t, i] with i < t <= last user of i: holding a value past its last use never helps. On a graph whose stage
    starts hold bytes outside the plan (`Graph.opening_held`) it can: holding an input into a stage to recompute a
    user there may leave less held at the stage's start than holding the user's output, so there S is tried up to
    the last stage that a recomputation of any descendant of i may read it."""
    latest = [max(users, default=i) for i, users in enumerate(graph.users)]
    if graph.opening_held:
        for i in range(graph.size - 1, -1, -1):
            latest[i] = max([latest[i], *(latest[j] for j in graph.users[i])])
    return [(t, i) for i in range(graph.size) for t in range(i + 1, latest[i] + 1)]


def fewest_computations(graph: Graph, S: np.ndarray) -> np.ndarray:
    """The smallest R with R[t, t] = 1 (8a) meeting (1c) S[t+1, i] <= R[t, i] + S[t, i] and (1b) R[t, j] <= R[t, i]
    + S[t, i] for each edge i -> j: in each stage, what must be computed, closed over inputs that are not held."""
    T = graph.size
    R = np.zeros((T, T), dtype=bool)
    for t in range(T):
        wanted = [t] + [i for i in range(t) if t + 1 < T and S[t + 1, i] and not S[t, i]]
        while wanted:
            node = wanted.pop()
            if R[t, node]:
                continue
            R[t, node] = True
            wanted.extend(i for i in graph.predecessors[node] if not S[t, i])
    return R


def meets_constraints(graph: Graph, R: np.ndarray, S: np.ndarray) -> bool:
    """The paper's (1b), (1c) and (8a-c), each written over whole matrices."""
    sources = np.array([i for j in range(graph.size) for i in graph.predecessors[j]], dtype=int)
    readers = np.array([j for j in range(graph.size) for _ in graph.predecessors[j]], dtype=int)
    frontier = bool(np.diag(R).all())  # (8a)
    triangular = not np.triu(R, k=1).any() and not np.triu(S).any()  # (8b), (8c)
    inputs_present = not (R[:, readers] & ~(R[:, sources] | S[:, sources])).any()  # (1b)
    held_from_before = not (S[1:] & ~(R[:-1] | S[:-1])).any()  # (1c)
    return frontier and triangular and inputs_present and held_from_before


def _frontier(points: dict[int, float]) -> list[tuple[int, float]]:
    frontier = []
    running = np.inf
    for peak in sorted(points):
        running = min(running, points[peak])
        frontier.append((peak, running))
    return frontier


@functools.cache  # the search is exponential: every test module asking for the same graph shares one run
def cost_peak_frontier(graph: Graph) -> list[tuple[int, float]]:
    """Every (peak, cheapest cost at that peak or lower) step of the exhaustive search, sorted by peak."""
    entries = useful_entries(graph)
    best: dict[int, float] = {}
    for bits in itertools.product((False, True), repeat=len(entries)):
        S = np.zeros((graph.size, graph.size), dtype=bool)
        for (t, i), bit in zip(entries, bits, strict=True):
            S[t, i] = bit
        R = fewest_computations(graph, S)
        assert meets_constraints(graph, R, S)
        cost, peak = paper_cost_and_peak(graph, R, S)
        best[peak] = min(best.get(peak, np.inf), cost)
    return _frontier(best)


def full_frontier(graph: Graph) -> list[tuple[int, float]]:
    """The same frontier from every lower-triangular R (diagonal set) and S that meets the constraints: tiny graphs
    only (2^(T(T-1)) candidates)."""
    T = graph.size
    below = [(t, i) for t in range(T) for i in range(t)]
    best: dict[int, float] = {}
    for r_bits in itertools.product((False, True), repeat=len(below)):
        R = np.eye(T, dtype=bool)
        for (t, i), bit in zip(below, r_bits, strict=True):
            R[t, i] = bit
        for s_bits in itertools.product((False, True), repeat=len(below)):
            S = np.zeros((T, T), dtype=bool)
            for (t, i), bit in zip(below, s_bits, strict=True):
                S[t, i] = bit
            if meets_constraints(graph, R, S):
                cost, peak = paper_cost_and_peak(graph, R, S)
                best[peak] = min(best.get(peak, np.inf), cost)
    return _frontier(best)


def cheapest_at(frontier: list[tuple[int, float]], budget: int) -> float | None:
    """The oracle's optimum within `budget`, or None when no schedule fits."""
    costs = [cost for peak, cost in frontier if peak <= budget]
    return min(costs) if costs else None


def fewest_computations_with_copies(graph: Graph, S: np.ndarray, copied_in: np.ndarray) -> np.ndarray:
    """The smallest R meeting (8a), (1b) and (1c) with copied-in values as a source: per stage, node t and what is
    held into the next stage without being on the device, closed over inputs that are not."""
    T = graph.size
    on_device = S | copied_in
    R = np.zeros((T, T), dtype=bool)
    for t in range(T):
        wanted = [t] + [i for i in range(t) if t + 1 < T and S[t + 1, i] and not on_device[t, i]]
        while wanted:
            node = wanted.pop()
            if not R[t, node]:
                R[t, node] = True
                wanted.extend(i for i in graph.predecessors[node] if not on_device[t, i])
    return R


def joint_optimum(graph: Graph, budget: int) -> float | None:
    """The cheapest plan within `budget` by exhaustive search over S, the copies back (each where its value is read
    again, two stages or more after it is made), for each value copied back every stage of its copy out, and for each
    copy back every first stage of its buffer's run that the rules allow; R the fewest computations these allow;
    priced by `oracles.moved_cost_and_usage`. Nothing from the library's planning. None when no plan fits."""
    T = graph.size
    held = useful_entries(graph)
    back = [(t, i) for i, users in enumerate(graph.users) if users for t in range(i + 2, max(users) + 1)]
    best = None
    for held_bits, back_bits in itertools.product(
        itertools.product((False, True), repeat=len(held)), itertools.product((False, True), repeat=len(back))
    ):
        S = np.zeros((T, T), dtype=bool)
        S[tuple(np.array(held, dtype=int).T)] = held_bits
        copy_in = np.zeros((T, T), dtype=bool)
        copy_in[tuple(np.array(back, dtype=int).T)] = back_bits
        R = fewest_computations_with_copies(graph, S, copy_in)
        if (copy_in & (S | R)).any():
            continue  # (m3)
        moved = sorted({int(i) for i in np.flatnonzero(copy_in.any(axis=0))})
        stages = [[s for s in range(int(np.flatnonzero(copy_in[:, i])[0]) - 1) if R[s, i] or S[s, i]] for i in moved]
        on_device = R | S | copy_in
        for outs in itertools.product(*stages):
            copy_out = np.zeros((T, T), dtype=bool)
            copy_out[list(outs), moved] = True
            runs = []  # per copy back, the buffers it may start at: after its copy out, off the device throughout
            for t, i in zip(*np.nonzero(copy_in), strict=True):
                made = outs[moved.index(int(i))]
                starts = [a for a in range(made + 1, int(t)) if not on_device[a : int(t), i].any()]
                runs.append([(int(t), int(i), a) for a in starts])
            for chosen in itertools.product(*runs):
                buffered = np.zeros((T, T), dtype=bool)
                for t, i, a in chosen:
                    buffered[a:t, i] = True
                cost, usage, _ = moved_cost_and_usage(graph, R, S, Moves(copy_out, copy_in, buffered))
                if max(usage) <= budget and (best is None or cost < best - 1e-9):
                    best = cost
    return best
