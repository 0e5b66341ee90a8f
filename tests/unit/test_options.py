"""The `Literal` choices of `checkmate.options` list the values the code accepts, no more and no fewer."""

from __future__ import annotations

import pytest

from checkmate.errors import InvalidArgument
from checkmate.milp.backends import backend_names, check_backend_name
from checkmate.options import CostModel, FakeCostModel, SolverChoice, SolverName, check_choice, choices


def test_solver_names_are_the_registered_backends() -> None:
    assert set(backend_names()) == set(choices(SolverName))
    assert set(choices(SolverChoice)) == {"auto", *choices(SolverName)}
    for name in choices(SolverChoice):
        check_backend_name(name)


def test_fake_cost_models_are_cost_models_without_profile() -> None:
    assert set(choices(FakeCostModel)) == set(choices(CostModel)) - {"profile"}


def test_check_choice_names_the_values() -> None:
    check_choice("cost_model", "flops", CostModel)
    with pytest.raises(InvalidArgument, match=r"cost_model must be one of \('profile', 'flops', 'unit'\)"):
        check_choice("cost_model", "time", CostModel)
