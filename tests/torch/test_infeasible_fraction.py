"""`checkmate.compile` with a budget given as a fraction names that fraction when it is too small, beside the bytes,
and the fraction known to work (which then compiles)."""

from __future__ import annotations

import re

import pytest
import torch
from torch import nn

import checkmate

pytestmark = pytest.mark.usefixtures("module_cache_directory")


def test_an_infeasible_fraction_names_itself_and_the_fraction_that_works() -> None:
    torch.manual_seed(0)
    model = nn.Sequential(*(layer for _ in range(6) for layer in (nn.Linear(16, 16), nn.ReLU())))
    batch = (torch.randn(8, 16), torch.randn(8, 16))

    def loss_fn(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return nn.functional.mse_loss(model(x), y)

    options = {"cost_model": "flops", "method": "chen_sqrtn", "cache": False}
    with pytest.raises(checkmate.InfeasibleBudget) as caught:
        checkmate.compile(model, loss_fn, batch, budget=0.05, **options)
    error = caught.value
    assert error.minimum is not None and error.minimum > error.budget
    text = str(error)
    assert text.startswith("budget 0.05 of the no-recomputation peak "), text
    found = re.search(r"\(([0-9.]+) of the peak\)", text)
    assert found is not None, text
    step = checkmate.compile(model, loss_fn, batch, budget=float(found.group(1)), **options)
    assert step.plan.peak_memory <= step.plan.budget
