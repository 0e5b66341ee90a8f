"""Checkmate for PyTorch: optimal tensor rematerialization (Jain et al., MLSys 2020).

The core (graph, plan, simulate, strategies) imports no torch; `capture` and `compile` do, lazily.
"""

from checkmate.errors import (
    CaptureError,
    CheckmateError,
    ExecutionError,
    InfeasibleBudget,
    InvalidGraph,
    InvalidSchedule,
    SolverUnavailable,
)
from checkmate.graph import Graph, Node
from checkmate.plan import Plan, cheapest_r, make_plan
from checkmate.simulate import Compute, Free, Schedule, check_plan, lower, simulate
from checkmate.solve import solve
from checkmate.units import format_bytes, parse_bytes

__all__ = [
    "CaptureError",
    "CheckmateError",
    "Compute",
    "ExecutionError",
    "Free",
    "Graph",
    "InfeasibleBudget",
    "InvalidGraph",
    "InvalidSchedule",
    "Node",
    "Plan",
    "Schedule",
    "SolverUnavailable",
    "cheapest_r",
    "check_plan",
    "format_bytes",
    "lower",
    "make_plan",
    "parse_bytes",
    "simulate",
    "solve",
]
