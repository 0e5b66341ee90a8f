"""Executors: what runs a plan's schedule, by name, as `checkmate.milp.backends` lists solvers.

    executor = executor_named("inductor")
    captured, program = executor.prepare(captured, model, batch, cost_model)

* "eager" (`checkmate.executors.eager`): each planning node's ATen ops, as captured; gradients bit for bit eager's.
* "inductor" (`checkmate.executors.inductor`): each planning node, and runs of the schedule, as Inductor-compiled
  functions; gradients equal eager's to rounding.

A new executor is a class meeting `Executor` (`checkmate.executors.protocol`), its name in
`checkmate.options.ExecutorName`, and one line in `EXECUTORS`.
"""

from __future__ import annotations

from checkmate.executors.eager import EagerExecutor
from checkmate.executors.inductor import InductorExecutor
from checkmate.executors.protocol import CaptureChoice, Executor
from checkmate.options import ExecutorName, check_choice

EXECUTORS: dict[ExecutorName, Executor] = {"eager": EagerExecutor(), "inductor": InductorExecutor()}


def executor_named(name: ExecutorName) -> Executor:
    """The executor called `name`.

    Raises:
        InvalidArgument: no executor has that name.
    """
    check_choice("executor", name, ExecutorName)
    return EXECUTORS[name]


__all__ = ["EXECUTORS", "CaptureChoice", "EagerExecutor", "Executor", "InductorExecutor", "executor_named"]
