"""Griewank & Walther binomial checkpointing (revolve) for linear chains, expressed as a fixed S.

The chain's n forward values are reversed with s snapshot slots by the classic recursion: advance from the
base value to a split point m, keep value m-1 as a snapshot, reverse [m, end) with s-1 slots, then reverse
[base, m-1) with s slots (value m-1 feeds its own gradient directly). The split points come from a dynamic
program over (length, slots) that minimises forward recomputations for uniform costs; its optimum follows
Griewank's binomial bound β(s, t) = C(s + t, s). The first descent runs during the forward pass, where every
value is computed anyway. Each snapshot becomes a run of ones in S, and R is the cheapest R for that S.

On chains with uniform costs this is the optimal (revolve) schedule for each number of slots; with other
costs it is still valid but not cost aware. Graphs that are not chains are refused.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import numpy as np

from checkmate.errors import InvalidGraph
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
        InvalidGraph: the graph has another shape; the message says which node breaks it.
    """
    T = graph.size
    n = (T - 1) // 2
    hint = "griewank only handles linear chains; use chen_sqrtn_linear, chen_greedy_linear or optimal instead"
    if T < 3 or T % 2 == 0 or int(graph.is_backward.sum()) != n + 1 or graph.is_backward[:n].any():
        raise InvalidGraph(f"the graph is not a chain of n forward nodes, a loss and n gradients; {hint}")
    for node, inputs in enumerate(graph.predecessors):
        if node <= n:
            required = allowed = {node - 1} - {-1}
        else:
            forward = 2 * n - node
            required, allowed = {node - 1}, {node - 1, forward, forward - 1} - {-1}
        if not required <= set(inputs) <= allowed:
            raise InvalidGraph(
                f"node {node} ({graph.nodes[node].name!r}) reads {list(inputs)}, which breaks the chain shape; {hint}"
            )
    return n


@dataclass(frozen=True)
class RevolveTable:
    """Forward recomputations and best splits for reversing chain pieces with a number of snapshot slots.

    Attributes:
        backward_cost: [length, slots] recomputations to reverse a piece whose base value is held.
        backward_split: [length, slots] the best split (values advanced before the snapshot), 0 for none.
        forward_cost: [length, slots] the same for the chain's tail during the forward pass.
        forward_split: [length, slots] the best split there, 0 for none.
    """

    backward_cost: np.ndarray
    backward_split: np.ndarray
    forward_cost: np.ndarray
    forward_split: np.ndarray


def revolve_table(n: int, slots: int) -> RevolveTable:
    """Dynamic program over pieces of length 0..n and 0..slots snapshot slots (uniform unit costs)."""
    lengths = np.arange(n + 1)
    backward_cost = np.zeros((n + 1, slots + 1))
    backward_split = np.zeros((n + 1, slots + 1), dtype=np.int64)
    forward_cost = np.zeros((n + 1, slots + 1))
    forward_split = np.zeros((n + 1, slots + 1), dtype=np.int64)
    # No slot: the gradient of the j-th value of the piece recomputes values 1..j from the base.
    backward_cost[:, 0] = lengths * (lengths + 1) / 2
    # In the forward pass the last value is live at the turn; the rest are reversed from the base.
    forward_cost[1:, 0] = backward_cost[:-1, 0]
    for s in range(1, slots + 1):
        backward_cost[1, s] = 1
        for length in range(2, n + 1):
            split = np.arange(1, length)
            options = split + backward_cost[length - split, s - 1] + backward_cost[split - 1, s]
            _choose(backward_cost, backward_split, length, s, options)
            options = forward_cost[length - split, s - 1] + backward_cost[split - 1, s]
            _choose(forward_cost, forward_split, length, s, options)
    return RevolveTable(backward_cost, backward_split, forward_cost, forward_split)


def _choose(cost: np.ndarray, split: np.ndarray, length: int, s: int, options: np.ndarray) -> None:
    """Take the best split when it beats leaving the slot unused (cost with s - 1 slots, split 0)."""
    best = int(np.argmin(options))
    cost[length, s] = cost[length, s - 1]
    if options[best] < cost[length, s]:
        cost[length, s] = options[best]
        split[length, s] = best + 1


def revolve_s(graph: Graph, n: int, slots: int, table: RevolveTable) -> np.ndarray:
    """S for the revolve schedule with `slots` snapshots on the chain of n forward nodes."""
    S = np.zeros((graph.size, graph.size), dtype=bool)
    for node in range(n, graph.size):
        last_use = graph.users[node][-1] if graph.users[node] else node
        S[node + 1 : last_use + 1, node] = True  # backward values are never recomputed
    for node in range(n - 1):
        S[node + 1, node] = True  # the next forward node reads it
    for node, first_stage in _snapshots(n, slots, table):
        S[first_stage : 2 * n - node + 1, node] = True  # held until its gradient, in stage 2n - node
    return S


def _snapshots(n: int, slots: int, table: RevolveTable) -> list[tuple[int, int]]:
    """(value, first stage held) of every snapshot, walking the recursion with an explicit stack."""
    held = [(n - 1, n)]  # the turn: the last forward value stays live into the loss and its gradient
    # Tasks: (in forward pass?, first value of the piece, end of the piece, slots).
    tasks: list[tuple[bool, int, int, int]] = [(True, 0, n, slots)]
    while tasks:
        in_forward, start, end, s = tasks.pop()
        length = end - start
        if length < 2 or s == 0:
            continue
        split = int((table.forward_split if in_forward else table.backward_split)[length, s])
        if split == 0:
            tasks.append((in_forward, start, end, s - 1))
            continue
        snapshot = start + split - 1
        # Made in the forward pass at its own stage, or in the stage of the piece's first gradient, 2n - (end-1).
        held.append((snapshot, snapshot + 1 if in_forward else 2 * n - end + 2))
        tasks.append((in_forward, snapshot + 1, end, s - 1))
        tasks.append((False, start, snapshot, s))
    return held


def revolve_plan(graph: Graph, slots: int, *, table: RevolveTable | None = None) -> Plan:
    """The revolve plan with `slots` snapshot slots (at most n - 1 are useful) on a chain graph."""
    n = chain_length(graph)
    slots = max(0, min(slots, n - 1))
    if table is None or table.backward_cost.shape[1] <= slots:
        table = revolve_table(n, slots)
    return plan_from_s(graph, revolve_s(graph, n, slots, table), method="griewank")


@register("griewank", "Griewank & Walther binomial checkpointing (revolve); chains only, optimal for uniform costs")
def griewank(graph: Graph, budget: int | None, *, slots: int | None = None) -> Plan:
    """Revolve with `slots` snapshots, or with the most slots (the cheapest plan) that fits the budget.

    Raises:
        InvalidGraph: the graph is not a chain (see `chain_length`).
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
    tables = [revolve_table(n, min(most, 1))]
    tried: dict[int, Plan] = {}

    def attempt(s: int) -> bool:
        if tables[-1].backward_cost.shape[1] <= s:
            tables.append(revolve_table(n, min(most, 2 * s)))
        if s not in tried:
            tried[s] = revolve_plan(graph, s, table=tables[-1])
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
