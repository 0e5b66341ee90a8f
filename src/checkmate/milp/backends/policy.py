"""Which solver runs which problem: the one place that names a solver for the searches.

* `backend="auto"` for a MILP: the first installed of AUTO_ORDER; from PORTFOLIO_VARIABLES variables on, HiGHS and
  SCIP side by side. On small MILPs (chains and random graphs, warm-started) HiGHS proves the optimum faster than
  SCIP; on real graphs of PORTFOLIO_VARIABLES variables and more neither wins every time
  (`benchmarks/investigations/milp_backends.py`).
* Linear programs (the relaxations of `approx` and the bounds, the retention bound's MILP): LP_BACKEND, whose simplex
  returns a vertex and a proven optimum quickly on these LPs.
"""

from __future__ import annotations

from collections.abc import Callable

from checkmate.options import SolverChoice, SolverName

AUTO_ORDER: tuple[SolverName, ...] = ("highs", "scip")
PORTFOLIO_VARIABLES = 20_000
LP_BACKEND: SolverName = "highs"


def too_little_time(remaining: float | None, num_variables: int, seconds_per_variable: float) -> bool:
    """Whether `remaining` seconds are too few to hand a model of `num_variables` variables to a solver that loads
    it at `seconds_per_variable` (outside its own clock)."""
    return remaining is not None and remaining < num_variables * seconds_per_variable


def solver_time_limit(remaining: float | None, num_variables: int, seconds_per_variable: float) -> float | None:
    """The time limit to give such a solver when `remaining` seconds are left: what is left after loading."""
    return None if remaining is None else max(0.0, remaining - num_variables * seconds_per_variable)


def choose_backend(
    name: SolverChoice, num_variables: int, installed: Callable[[], tuple[SolverName, ...]]
) -> SolverName:
    """Resolve "auto" to a concrete backend among `installed()` (the portfolio for a problem this large); any other
    name is returned as it is."""
    if name != "auto":
        return name
    available = installed()
    if num_variables >= PORTFOLIO_VARIABLES and "portfolio" in available:
        return "portfolio"
    return next((candidate for candidate in AUTO_ORDER if candidate in available), AUTO_ORDER[0])
