"""The step's predicted time as it runs: the plan's steps after the program's passes have rewritten them.

The search prices a plan by its nodes' costs (a first run at `Node.cost`, a recomputation at its recompute cost).
The step that runs may differ: the Inductor executor compiles runs of the schedule as one call each, which fuse
across nodes. Each such call's measured time (`SegmentCall.seconds`) replaces the costs of the computations it runs;
every other computation counts at its node's cost, and frees and a distribution's calls at nothing. With costs in
seconds (measured) this is the time the step's computations should take, to set beside the step as timed.
"""

from __future__ import annotations

from collections.abc import Sequence

from checkmate.execute.codegen import ScheduleItem, SegmentCall
from checkmate.graph import Graph
from checkmate.simulate import Compute


def compute_cost(graph: Graph, step: Compute) -> float:
    """The cost of one computation: its node's first run at its own stage, a recomputation after it."""
    costs = graph.costs if step.stage == step.node else graph.recompute_costs
    return float(costs[step.node])


def predicted_seconds(graph: Graph, steps: Sequence[ScheduleItem]) -> float:
    """The time of `steps` (a lowered schedule of `graph`): measured fused calls, every other computation priced."""
    total = 0.0
    for step in steps:
        if isinstance(step, Compute):
            total += compute_cost(graph, step)
        elif isinstance(step, SegmentCall):
            if step.seconds is None:
                total += sum(compute_cost(graph, compute) for compute in step.computes)
            else:
                total += step.seconds
    return total
