"""Checkmate for PyTorch: optimal tensor rematerialization (Jain et al., MLSys 2020).

The core (graph, plan, simulate, strategies) imports no torch; `capture` and `compile` do, lazily.
"""

import ast
import os
from typing import Any

from checkmate.byte_sizes import format_bytes, parse_bytes
from checkmate.captured import Captured
from checkmate.errors import (
    CaptureError,
    CheckmateError,
    ExecutionError,
    InfeasibleBudget,
    InvalidArgument,
    InvalidGraph,
    InvalidSchedule,
    MethodNotApplicable,
    SolverUnavailable,
)
from checkmate.experiments.batch_search import MaxBatch
from checkmate.graph import Graph, Node
from checkmate.moved import HostLink, LinkSpeeds, Moves
from checkmate.options import ShardedOptions
from checkmate.plan import Plan, cheapest_r, make_plan
from checkmate.progress import Progress, SearchControl
from checkmate.simulate import Compute, Free, Schedule, check_plan, lower, simulate
from checkmate.solve import solve
from checkmate.strategies.feasibility import lower_bound, minimum_budget


def capture(model: Any, loss_fn: Any, batch: Any, **options: Any) -> Captured:
    """Capture one training step as a planning graph; see `checkmate.torch_capture.capture` (imports torch on the
    first call, so that `import checkmate` does not)."""
    from checkmate.torch_capture import capture as capture_step

    return capture_step(model, loss_fn, batch, **options)


def backend(budget: int | float | str, **options: Any) -> Any:
    """A `torch.compile` backend that plans each compiled region's forward and backward within `budget`; see
    `checkmate.inductor.backend.backend` (imports torch and Inductor)."""
    from checkmate.inductor.backend import backend as make_backend

    return make_backend(budget, **options)


def compile(model: Any, loss_fn: Any, batch: Any, **options: Any) -> Any:
    """Plan a training step within a memory budget and return a step that runs the plan; see
    `checkmate.compile_step.compile` (imports torch).
    """
    from checkmate.compile_step import compile as compile_training_step

    return compile_training_step(model, loss_fn, batch, **options)


def _docstring(path: str, function: str) -> str | None:
    """The docstring of `function` in the module at `path` (relative to this package), read from its source without
    importing it (its package imports torch)."""
    try:
        with open(os.path.join(os.path.dirname(__file__), path), encoding="utf-8") as source:
            tree = ast.parse(source.read())
    except OSError:
        return None
    for node in tree.body:
        if isinstance(node, ast.FunctionDef) and node.name == function:
            return ast.get_docstring(node)
    return None


# help(checkmate.compile) and the others show the full documentation of the function they call.
capture.__doc__ = _docstring("torch_capture/__init__.py", "capture") or capture.__doc__
backend.__doc__ = _docstring("inductor/backend.py", "backend") or backend.__doc__
compile.__doc__ = _docstring("compile_step.py", "compile") or compile.__doc__


def max_batch(factory: Any, memory: int | str, **options: Any) -> MaxBatch:
    """The largest batch size whose step trains within `memory`; see `checkmate.model_max_batch.max_batch`
    (imports torch)."""
    from checkmate.model_max_batch import max_batch as search

    return search(factory, memory, **options)


__all__ = [
    "CaptureError",
    "Captured",
    "CheckmateError",
    "Compute",
    "ExecutionError",
    "Free",
    "Graph",
    "HostLink",
    "InfeasibleBudget",
    "InvalidArgument",
    "InvalidGraph",
    "InvalidSchedule",
    "LinkSpeeds",
    "MaxBatch",
    "MethodNotApplicable",
    "Moves",
    "Node",
    "Plan",
    "Progress",
    "Schedule",
    "SearchControl",
    "ShardedOptions",
    "SolverUnavailable",
    "backend",
    "capture",
    "cheapest_r",
    "check_plan",
    "compile",
    "format_bytes",
    "lower",
    "lower_bound",
    "make_plan",
    "max_batch",
    "minimum_budget",
    "parse_bytes",
    "simulate",
    "solve",
]
