"""The interface every solver adapter implements."""

from __future__ import annotations

from typing import Protocol

import numpy as np

from checkmate.milp.problem import MilpProblem, MilpSolution, SolveOptions


class MilpBackend(Protocol):
    """A solver adapter. It sees only the backend-neutral MilpProblem, never a graph.

    `is_available` is cheap, cached, and never takes a licence. `solve` returns infeasibility and time
    limits as a SolveStatus, never as an exception; `start` is an optional feasible point (a warm start).
    """

    name: str

    def is_available(self) -> bool: ...

    def solve(self, problem: MilpProblem, options: SolveOptions, start: np.ndarray | None = None) -> MilpSolution: ...
