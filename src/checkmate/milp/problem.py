"""Backend-neutral mixed-integer programs: the matrices a solver sees, its options and its answer."""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import scipy.sparse as sp


@dataclass(frozen=True)
class MilpProblem:
    """minimise c @ x subject to row_lower <= A @ x <= row_upper, col_lower <= x <= col_upper, x[integer] integral.

    Attributes:
        c: float64[n] objective coefficients.
        A: the constraint matrix, scipy CSC of shape (m, n).
        row_lower, row_upper: float64[m]; -inf / +inf for a free side.
        col_lower, col_upper: float64[n] variable bounds.
        integer: bool[n], True for integer (here: binary) variables.
    """

    c: np.ndarray
    A: sp.csc_array
    row_lower: np.ndarray
    row_upper: np.ndarray
    col_lower: np.ndarray
    col_upper: np.ndarray
    integer: np.ndarray

    @property
    def num_variables(self) -> int:
        return int(self.c.size)

    @property
    def num_constraints(self) -> int:
        return int(self.row_lower.size)

    @property
    def num_nonzeros(self) -> int:
        return int(self.A.nnz)

    def relaxed(self) -> MilpProblem:
        """The LP relaxation: the same problem with every variable continuous."""
        return dataclasses.replace(self, integer=np.zeros_like(self.integer))

    def with_row_upper(self, row_upper: np.ndarray) -> MilpProblem:
        """The same problem with other right-hand sides (row lower sides unchanged)."""
        return dataclasses.replace(self, row_upper=row_upper)

    def with_col_upper(self, col_upper: np.ndarray) -> MilpProblem:
        """The same problem with other variable upper bounds."""
        return dataclasses.replace(self, col_upper=col_upper)

    def max_violation(self, x: np.ndarray) -> float:
        """The largest violation of a row, bound or integrality by x (0.0 when x is feasible)."""
        activity = self.A @ x
        violations = [
            np.max(self.row_lower - activity, initial=0.0),
            np.max(activity - self.row_upper, initial=0.0),
            np.max(self.col_lower - x, initial=0.0),
            np.max(x - self.col_upper, initial=0.0),
            np.max(np.abs(x[self.integer] - np.round(x[self.integer])), initial=0.0),
        ]
        return float(max(violations))


class SolveStatus(enum.Enum):
    """How a solve ended."""

    OPTIMAL = "optimal"  # proven optimal within the requested relative gap
    FEASIBLE = "feasible"  # stopped (time limit) with an incumbent
    INFEASIBLE = "infeasible"  # proven to have no solution
    NO_SOLUTION = "no_solution"  # stopped without an incumbent and without a proof of infeasibility


@dataclass(frozen=True)
class SolveOptions:
    """Solver settings, translated by each backend into its own parameter names in one place.

    Attributes:
        time_limit: wall-clock seconds, or None for no limit.
        mip_gap: relative gap at which a MIP counts as solved (1e-4: optimal for any practical purpose).
        mip_abs_gap: absolute gap at which a MIP counts as solved (below 1 for an objective known to be integral).
        threads: solver threads, or None for the solver's default.
        verbose: print the solver's own log.
        seed: the solver's random seed.
        on_progress: called during a MIP solve with (incumbent objective or None, proven bound or None), in the
            problem's own objective, whenever either improves (and now and then otherwise).
        should_stop: polled during a MIP solve; when it returns True the solver stops and returns its incumbent.
        interrupted: a stop that must not wait for the solver (Ctrl-C): once it returns True, the solver is asked
            to stop and given `checkmate.milp.backends.detached.GRACE_SECONDS` to answer, after which the solve
            returns NO_SOLUTION without it.
    """

    time_limit: float | None = None
    mip_gap: float = 1e-4
    mip_abs_gap: float = 0.0
    threads: int | None = None
    verbose: bool = False
    seed: int = 0
    on_progress: Callable[[float | None, float | None], None] | None = None
    should_stop: Callable[[], bool] | None = None
    interrupted: Callable[[], bool] | None = None


@dataclass(frozen=True)
class MilpSolution:
    """What a backend returns.

    Attributes:
        status: how the solve ended.
        x: the best solution found (float64[n]), or None.
        objective: c @ x for that solution, or None.
        bound: the best proven lower bound on the optimum (the LP value for an LP), or None.
        solve_time: seconds inside the solver.
        backend: the backend's name.
    """

    status: SolveStatus
    x: np.ndarray | None
    objective: float | None
    bound: float | None
    solve_time: float
    backend: str
