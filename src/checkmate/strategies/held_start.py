"""Starting plans given from outside the search, as the forward nodes they hold through the backward pass.

A partitioner that splits a training step into a forward and a backward function (torch.compile's min-cut
partitioner) decides which forward values the backward reads from memory and which it computes again. On a planning
graph that decision is a set of held forward nodes: `HeldStart`. Its plan (`held_start_plan`) keeps each held node,
and every backward value, from its computation until its last use; a forward node that is not held is kept while
the forward pass reads it, then computed again in the first backward stage that reads it and kept until its last
use. What it needs that nothing holds is recomputed in that stage as a temporary (the cheapest R for this S).

The searches take such starts beside their own (`checkmate.strategies.warm_start.best_baseline`), priced by the same
graph, so their answer costs at most the cheapest start within the budget.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from checkmate.graph import Graph
from checkmate.plan import Plan
from checkmate.strategies.common import plan_from_s


@dataclass(frozen=True)
class HeldStart:
    """A starting plan as the forward nodes it holds through the backward pass.

    Attributes:
        label: where it comes from, for the log (say, "torch.compile partitioner, activation_memory_budget=0.5").
        held: indices of the forward nodes held from their computation until their last use, in increasing order;
            the other forward nodes that the backward reads are computed again there.
    """

    label: str
    held: tuple[int, ...]


def held_start_s(graph: Graph, held: tuple[int, ...]) -> np.ndarray:
    """S of a held set (module doc): bool[T, T], strictly lower triangular."""
    T = graph.size
    kept = np.zeros(T, dtype=bool)
    kept[list(held)] = True
    is_backward = graph.is_backward
    S = np.zeros((T, T), dtype=bool)
    for node, users in enumerate(graph.users):
        if not users:
            continue
        backward_users = [user for user in users if is_backward[user]]
        if is_backward[node] or kept[node] or not backward_users:
            S[node + 1 : users[-1] + 1, node] = True
            continue
        forward_users = [user for user in users if not is_backward[user]]
        if forward_users:
            S[node + 1 : forward_users[-1] + 1, node] = True
        S[backward_users[0] + 1 : users[-1] + 1, node] = True
    return S


def held_start_plan(graph: Graph, start: HeldStart, *, method: str) -> Plan:
    """The plan of `start` on `graph`: its S (`held_start_s`) with the cheapest R, simulated."""
    return plan_from_s(graph, held_start_s(graph, start.held), method=method)
