"""The Gurobi adapter's error paths, against a stand-in `gurobipy` (the real one is not installed here).

The stand-in builds models and raises `GurobiError` where asked, so both failure points are exercised: building
the model (a missing licence) and `optimize()` (a size-limited licence refuses a large model).
"""

from __future__ import annotations

import sys
import types
from typing import Any

import numpy as np
import pytest
import scipy.sparse as sp

from checkmate import SolverUnavailable
from checkmate.milp.backends.gurobi import GurobiBackend
from checkmate.milp.problem import MilpProblem, SolveOptions


class _GurobiError(Exception):
    pass


class _Parameters:
    def __setattr__(self, name: str, value: Any) -> None:
        object.__setattr__(self, name, value)


def _stand_in(fail_at: str) -> types.ModuleType:
    class Model:
        def __init__(self) -> None:
            if fail_at == "build":
                raise _GurobiError("No Gurobi license found")
            self.Params = _Parameters()

        def addMVar(self, *args: Any, **kwargs: Any) -> object:  # noqa: N802 (gurobipy names)
            return object()

        def addMConstr(self, *args: Any) -> None:  # noqa: N802
            return None

        def getVars(self) -> list[object]:  # noqa: N802
            return []

        def optimize(self) -> None:
            raise _GurobiError("Model too large for size-limited license")

    module = types.ModuleType("gurobipy")
    module.GurobiError = _GurobiError  # type: ignore[attr-defined]
    module.Model = Model  # type: ignore[attr-defined]
    return module


def _problem() -> MilpProblem:
    return MilpProblem(
        c=np.ones(2),
        A=sp.csc_array(np.ones((1, 2))),
        row_lower=np.array([1.0]),
        row_upper=np.array([np.inf]),
        col_lower=np.zeros(2),
        col_upper=np.ones(2),
        integer=np.array([True, True]),
    )


@pytest.mark.parametrize(("fail_at", "message"), [("build", "cannot start"), ("optimize", "stopped while solving")])
def test_gurobi_errors_become_solver_unavailable(monkeypatch: pytest.MonkeyPatch, fail_at: str, message: str) -> None:
    monkeypatch.setitem(sys.modules, "gurobipy", _stand_in(fail_at))
    monkeypatch.setattr(GurobiBackend, "is_available", lambda self: True)
    with pytest.raises(SolverUnavailable, match=message) as caught:
        GurobiBackend().solve(_problem(), SolveOptions(time_limit=1.0))
    assert "highs" in str(caught.value) or "scip" in str(caught.value), "the error says what to use instead"
