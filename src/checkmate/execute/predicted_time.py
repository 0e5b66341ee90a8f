"""The step's predicted time as it runs: the plan's steps after the program's passes have rewritten them.

The search prices a plan by its nodes' costs (a first run at `Node.cost`, a recomputation at its recompute cost,
which is lower where it is priced as running inside its reader's fused kernel). The step that runs may differ: the
Inductor executor compiles runs of the schedule as one call each, which fuse across nodes. Each such call's measured
time (`SegmentCall.seconds`) replaces the costs of the computations it runs; a computation outside any call is a call
of its own and counts at its node's `cost`, a recomputation too (a run split to fit the plan's peak can leave a
recomputation priced as fused on its own); frees and a distribution's calls count nothing. With costs in seconds
(measured) this is the time the step's computations should take, to set beside the step as timed.
"""

from __future__ import annotations

from collections.abc import Sequence

from checkmate.execute.codegen import ScheduleItem, SegmentCall
from checkmate.graph import Graph
from checkmate.simulate import Compute


def predicted_seconds(graph: Graph, steps: Sequence[ScheduleItem]) -> float:
    """The time of `steps` (a lowered schedule of `graph`): measured fused calls, every other computation at its own
    call's cost."""
    total = 0.0
    for step in steps:
        if isinstance(step, Compute):
            total += float(graph.costs[step.node])
        elif isinstance(step, SegmentCall):
            total += step.seconds
    return total
