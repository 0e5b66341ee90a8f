"""Solver backends behind one interface, selected by name."""

from __future__ import annotations

from checkmate.errors import InvalidArgument, SolverUnavailable
from checkmate.milp.backends.base import MilpBackend
from checkmate.milp.backends.gurobi import GurobiBackend
from checkmate.milp.backends.highs import HighsBackend
from checkmate.milp.backends.policy import LP_BACKEND
from checkmate.milp.backends.policy import choose_backend as _choose_backend
from checkmate.milp.backends.portfolio import PortfolioBackend
from checkmate.milp.backends.scip import ScipBackend
from checkmate.options import SolverChoice, SolverName

_BACKENDS: dict[SolverName, MilpBackend] = {
    backend.name: backend for backend in (HighsBackend(), ScipBackend(), GurobiBackend(), PortfolioBackend())
}


def backend_names() -> tuple[SolverName, ...]:
    """Every known backend name, installed or not."""
    return tuple(_BACKENDS)


def available_backends() -> tuple[SolverName, ...]:
    """The backends whose package is installed (no licence is taken)."""
    return tuple(name for name, backend in _BACKENDS.items() if backend.is_available())


def check_backend_name(name: str) -> None:
    """InvalidArgument unless `name` is a known backend (installed or not) or "auto": checked before any work."""
    if name != "auto" and name not in _BACKENDS:
        raise InvalidArgument(_unknown(name))


def get_backend(name: str) -> MilpBackend:
    """The backend called `name`; SolverUnavailable when it is unknown or not installed."""
    if name not in _BACKENDS:
        raise SolverUnavailable(_unknown(name))
    backend = _BACKENDS[name]
    if not backend.is_available():
        raise SolverUnavailable(
            f"backend {name!r} is not installed; installed: {', '.join(available_backends()) or 'none'}"
        )
    return backend


def milp_backend(name: SolverChoice, num_variables: int) -> MilpBackend:
    """The backend that solves a MILP of `num_variables` variables when the user asked for `name` ("auto" resolves
    by `checkmate.milp.backends.policy`)."""
    return get_backend(_choose_backend(name, num_variables, available_backends))


def lp_backend() -> MilpBackend:
    """The backend that solves the searches' linear programs (`policy.LP_BACKEND`)."""
    return get_backend(LP_BACKEND)


def _unknown(name: str) -> str:
    return f"unknown MILP backend {name!r}; choose one of {', '.join(_BACKENDS)} or 'auto'"


__all__ = [
    "MilpBackend",
    "available_backends",
    "backend_names",
    "check_backend_name",
    "get_backend",
    "lp_backend",
    "milp_backend",
]
