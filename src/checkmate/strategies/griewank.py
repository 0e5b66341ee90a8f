"""Griewank & Walther binomial checkpointing (revolve) for linear chains, expressed as a fixed S.

The chain's n forward values are reversed with s snapshot slots by the classic recursion: advance from the
base value to a split point m, keep value m-1 as a snapshot, reverse [m, end) with s-1 slots, then reverse
[base, m-1) with s slots (value m-1 feeds its own gradient directly). Each split minimises the forward
recomputations of its piece, with the pieces' optimal costs taken from Griewank's closed form t·l − β(s+1, t−1),
β(s, t) = C(s + t, s). The first descent runs during the forward pass, where every value is computed anyway.
Each snapshot becomes a run of ones in S, and R is the cheapest R for that S.

On chains with uniform costs the plan's recomputations equal Griewank's optimal (binomial) count for its number of
slots; with other costs it is still valid but not cost aware. Graphs that are not chains are refused.
"""

from __future__ import annotations

import functools
import logging
import math

import numpy as np

from checkmate.errors import MethodNotApplicable
from checkmate.graph import Graph
from checkmate.plan import Plan
from checkmate.strategies.common import cheapest_within, fits, plan_from_s
from checkmate.strategies.registry import register

log = logging.getLogger(__name__)


def chain_length(graph: Graph) -> int:
    """n, when `graph` is a chain's training graph as `linear_graph` (or `training_graph` of a chain) builds it.

    The shape: forward nodes 0..n-1, each reading only the one before; the loss n reading n-1; then backward
    node 2n-j (the gradient of forward node j) reading the backward node before it, plus forward j and j-1.

    Raises:
        MethodNotApplicable: the graph has another shape; the message says which node breaks it.
    """
    T = graph.size
    n = (T - 1) // 2
    hint = "griewank only handles linear chains; use chen_sqrtn_linear, chen_greedy_linear or optimal instead"
    if T < 3 or T % 2 == 0 or int(graph.is_backward.sum()) != n + 1 or graph.is_backward[:n].any():
        raise MethodNotApplicable(f"the graph is not a chain of n forward nodes, a loss and n gradients; {hint}")
    for node, inputs in enumerate(graph.predecessors):
        if node <= n:
            required = allowed = {node - 1} - {-1}
        else:
            forward = 2 * n - node
            required, allowed = {node - 1}, {node - 1, forward, forward - 1} - {-1}
        if not required <= set(inputs) <= allowed:
            raise MethodNotApplicable(
                f"node {node} ({graph.nodes[node].name!r}) reads {list(inputs)}, which breaks the chain shape; {hint}"
            )
    return n


@functools.lru_cache(maxsize=64)
def _piece_costs(n: int, slots: int) -> np.ndarray:
    """Recomputations to reverse a piece of 0..n values whose base value is held, with `slots` snapshot slots.

    A piece of l values with its base held is revolve on l + 1 states with one more snapshot (the base), so its
    cost is binomial_steps(l + 1, slots + 1): l(l + 1)/2 with no slot, down to l with l - 1 slots or more.
    """
    snapshots = slots + 1
    betas = [1]
    while betas[-1] < n + 1:
        betas.append(math.comb(snapshots + len(betas), snapshots))
    states = np.arange(1, n + 2)
    repetitions = np.searchsorted(np.array(betas), states)
    correction = np.array([math.comb(snapshots + t, snapshots + 1) for t in range(len(betas))])
    costs = repetitions * states - correction[repetitions]
    costs.setflags(write=False)
    return costs


def _best_split(n: int, length: int, slots: int, *, in_forward: bool) -> int:
    """Values to advance before the next snapshot (1..length-1), or 0 when using one slot fewer is as cheap.

    Backward pieces: split + C(length - split, slots - 1) + C(split - 1, slots). In the forward pass the advance is
    free, and so is the first computation of the later part: C(length - split, slots - 1) - (length - split) + ....
    """
    split = np.arange(1, length)
    later = _piece_costs(n, slots - 1)[length - split]
    earlier = _piece_costs(n, slots)[split - 1]
    advance = -(length - split) if in_forward else split
    options = advance + later + earlier
    best = int(np.argmin(options))
    one_slot_fewer = _piece_costs(n, slots - 1)[length] - (length if in_forward else 0)
    return best + 1 if options[best] <= one_slot_fewer else 0


def revolve_s(graph: Graph, n: int, slots: int) -> np.ndarray:
    """S for the revolve schedule with `slots` snapshots on the chain of n forward nodes."""
    S = np.zeros((graph.size, graph.size), dtype=bool)
    for node in range(n, graph.size):
        last_use = graph.users[node][-1] if graph.users[node] else node
        S[node + 1 : last_use + 1, node] = True  # backward values are never recomputed
    for node in range(n - 1):
        S[node + 1, node] = True  # the next forward node reads it
    for node, first_stage in _snapshots(n, slots):
        S[first_stage : 2 * n - node + 1, node] = True  # held until its gradient, in stage 2n - node
    return S


def _snapshots(n: int, slots: int) -> list[tuple[int, int]]:
    """(value, first stage held) of every snapshot, walking the recursion with an explicit stack."""
    held = [(n - 1, n)]  # the turn: the last forward value stays live into the loss and its gradient
    # Tasks: (in forward pass?, first value of the piece, end of the piece, slots).
    tasks: list[tuple[bool, int, int, int]] = [(True, 0, n, slots)]
    while tasks:
        in_forward, start, end, s = tasks.pop()
        length = end - start
        if length < 2 or s == 0:
            continue
        split = _best_split(n, length, s, in_forward=in_forward)
        if split == 0:
            tasks.append((in_forward, start, end, s - 1))
            continue
        snapshot = start + split - 1
        # Made in the forward pass at its own stage, or in the stage of the piece's first gradient, 2n - (end-1).
        held.append((snapshot, snapshot + 1 if in_forward else 2 * n - end + 2))
        tasks.append((in_forward, snapshot + 1, end, s - 1))
        tasks.append((False, start, snapshot, s))
    return held


def revolve_plan(graph: Graph, slots: int) -> Plan:
    """The revolve plan with `slots` snapshot slots (at most n - 1 are useful) on a chain graph."""
    n = chain_length(graph)
    slots = max(0, min(slots, n - 1))
    return plan_from_s(graph, revolve_s(graph, n, slots), method="griewank")


@register("griewank", "Griewank & Walther binomial checkpointing (revolve); chains only, optimal for uniform costs")
def griewank(graph: Graph, budget: int | None, *, slots: int | None = None) -> Plan:
    """Revolve with `slots` snapshots, or with the most slots (the cheapest plan) that fits the budget.

    Raises:
        MethodNotApplicable: the graph is not a chain (see `chain_length`).
        InfeasibleBudget: even revolve with no snapshot slot needs more than the budget.
    """
    n = chain_length(graph)
    if slots is not None:
        return cheapest_within([revolve_plan(graph, slots)], budget, method="griewank")
    if budget is None:
        return revolve_plan(graph, n - 1)
    return cheapest_within(_slot_search(graph, n, budget), budget, method="griewank")


def _slot_search(graph: Graph, n: int, budget: int) -> list[Plan]:
    """Plans for the slot counts tried while looking for the most slots within the budget.

    Doubles the slot count until the peak passes the budget, then bisects; this assumes the peak does not fall
    as slots are added (it grows by about one value per slot). Slot count 0 is always among the plans.
    """
    most = n - 1
    tried: dict[int, Plan] = {}

    def attempt(s: int) -> bool:
        if s not in tried:
            tried[s] = revolve_plan(graph, s)
        return fits(tried[s], budget)

    low, high = 0, 1
    while high <= most and attempt(high):
        low, high = high, 2 * high
    high = min(high, most + 1)
    while high - low > 1:
        middle = (low + high) // 2
        low, high = (middle, high) if attempt(middle) else (low, middle)
    attempt(low)
    log.debug("griewank: %d slots fit %d bytes (tried %s)", low, budget, sorted(tried))
    return list(tried.values())
