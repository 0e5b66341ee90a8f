"""checkpoint_all: keep every value until its last use and never recompute (the framework default)."""

from __future__ import annotations

import numpy as np

from checkmate.graph import Graph
from checkmate.plan import Plan
from checkmate.strategies.common import cheapest_within, plan_from_s
from checkmate.strategies.registry import register


def checkpoint_all_s(graph: Graph) -> np.ndarray:
    """S[t, i] = 1 for i < t <= last user of i: each value is held until the stage of its last consumer."""
    T = graph.size
    last_use = np.array([users[-1] if users else -1 for users in graph.users], dtype=np.int64)
    stages = np.arange(T)[:, None]
    nodes = np.arange(T)[None, :]
    return (nodes < stages) & (stages <= last_use[None, :])


@register("checkpoint_all", "no recomputation: keep every value until its last use (the reference cost and peak)")
def checkpoint_all(graph: Graph, budget: int | None) -> Plan:
    plan = plan_from_s(graph, checkpoint_all_s(graph), method="checkpoint_all")
    return cheapest_within([plan], budget, method="checkpoint_all")
