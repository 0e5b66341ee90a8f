"""Solver backends behind one interface, selected by name."""

from __future__ import annotations

from checkmate.errors import SolverUnavailable
from checkmate.milp.backends.base import MilpBackend
from checkmate.milp.backends.gurobi import GurobiBackend
from checkmate.milp.backends.highs import HighsBackend
from checkmate.milp.backends.portfolio import PortfolioBackend
from checkmate.milp.backends.scip import ScipBackend

_BACKENDS: dict[str, MilpBackend] = {
    backend.name: backend for backend in (HighsBackend(), ScipBackend(), GurobiBackend(), PortfolioBackend())
}


def backend_names() -> tuple[str, ...]:
    """Every known backend name, installed or not."""
    return tuple(_BACKENDS)


def available_backends() -> tuple[str, ...]:
    """The backends whose package is installed (no licence is taken)."""
    return tuple(name for name, backend in _BACKENDS.items() if backend.is_available())


def get_backend(name: str) -> MilpBackend:
    """The backend called `name`; SolverUnavailable when it is unknown or not installed."""
    if name not in _BACKENDS:
        raise SolverUnavailable(f"unknown MILP backend {name!r}; choose one of {', '.join(_BACKENDS)} or 'auto'")
    backend = _BACKENDS[name]
    if not backend.is_available():
        raise SolverUnavailable(
            f"backend {name!r} is not installed; installed: {', '.join(available_backends()) or 'none'}"
        )
    return backend


__all__ = ["MilpBackend", "available_backends", "backend_names", "get_backend"]
