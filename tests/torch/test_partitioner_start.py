"""torch.compile's partitioner's saved sets as starting plans (`checkmate.inductor.partitioner_start`).

Oracles: `check_plan` (every dependency computed or held), checkpoint_all's cost (at activation_memory_budget=1 the
partitioner saves what the backward reads, so nothing is recomputed), the start's own cost (a search given it returns
no more) and the log of `checkmate.compile(..., executor="inductor")`.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import pytest
import torch

import checkmate
from checkmate import check_plan, solve, zoo
from checkmate.inductor.partitioner_start import backward_reads, held_nodes, partitioner_starts, saved_values
from checkmate.strategies.held_start import HeldStart, held_start_plan
from checkmate.torch_capture import capture

pytestmark = pytest.mark.usefixtures("module_cache_directory")

MODELS: dict[str, Callable[[], Any]] = {
    "gpt": lambda: zoo.gpt(2, length=16, dim=32, heads=2, layers=2, vocab=32, dropout=0.0),
    "resnet": lambda: zoo.resnet(batch_size=2, image_size=16, width=8, blocks=(1, 1)),
}


@pytest.fixture(scope="module", params=list(MODELS))
def captured(request: pytest.FixtureRequest) -> checkmate.Captured:
    torch.manual_seed(0)
    model, loss_fn, batch = MODELS[request.param]()
    return capture(model, loss_fn, batch, cost_model="flops", fused=True)


def _start(captured: checkmate.Captured, level: float) -> HeldStart:
    held = held_nodes(captured, backward_reads(captured), saved_values(captured, level))
    return HeldStart(f"level {level}", held)


def test_the_saved_set_holds_forward_nodes_and_is_a_valid_plan(captured: checkmate.Captured) -> None:
    graph = captured.graph
    everything = solve(graph, None, method="checkpoint_all")
    fastest = held_start_plan(graph, _start(captured, 1.0), method="1.0")
    check_plan(graph, fastest.R, fastest.S)
    assert fastest.R.sum() == graph.size, "at activation_memory_budget=1 the backward recomputes nothing"
    assert fastest.cost == pytest.approx(everything.cost)
    lean_start = _start(captured, 0.1)
    assert not graph.is_backward[list(lean_start.held)].any()
    lean = held_start_plan(graph, lean_start, method="0.1")
    check_plan(graph, lean.R, lean.S)
    assert lean.R.sum() > graph.size, "at activation_memory_budget=0.1 the backward recomputes"
    assert lean.peak_memory < fastest.peak_memory


def test_a_search_out_of_time_answers_with_the_partitioners_plan(captured: checkmate.Captured) -> None:
    """With no time to search, the partitioner's plan that fits the budget is the answer (the baselines are not
    tried once the time is up; without the start the search finds nothing)."""
    graph = captured.graph
    target = held_start_plan(graph, _start(captured, 0.4), method="0.4")
    starts = partitioner_starts(captured, target.peak_memory)
    plans = [held_start_plan(graph, start, method=start.label) for start in starts]
    cheapest = min(plan.cost for plan in plans if plan.peak_memory <= target.peak_memory)
    with pytest.raises(checkmate.InfeasibleBudget):
        solve(graph, target.peak_memory, method="optimal", time_limit=0, progress=False)
    plan = solve(graph, target.peak_memory, method="optimal", time_limit=0, progress=False, extra_starts=starts)
    assert plan.peak_memory <= target.peak_memory
    assert plan.cost <= cheapest


@pytest.mark.slow
def test_compile_with_the_inductor_executor_weighs_the_partitioners_plans(caplog: pytest.LogCaptureFixture) -> None:
    torch.manual_seed(0)
    model, loss_fn, batch = MODELS["gpt"]()
    with caplog.at_level(logging.INFO, logger="checkmate"):
        step = checkmate.compile(
            model, loss_fn, batch, budget=0.8, executor="inductor", cost_model="flops", time_limit=5, cache=False
        )
    assert step.plan.peak_memory <= step.plan.budget
    assert "torch.compile's partitioner:" in caplog.text
    assert "given starting plans fit the budget" in caplog.text


@pytest.mark.slow
def test_a_plan_from_the_cache_runs_no_partitioner(caplog: pytest.LogCaptureFixture) -> None:
    """The starts serve a search only: a second compile whose plan comes from the disk cache makes none."""
    torch.manual_seed(0)
    model, loss_fn, batch = MODELS["gpt"]()
    options: dict[str, Any] = {"budget": 0.8, "executor": "inductor", "cost_model": "flops", "time_limit": 5}
    first = checkmate.compile(model, loss_fn, batch, **options)
    with caplog.at_level(logging.INFO, logger="checkmate"):
        second = checkmate.compile(model, loss_fn, batch, **options)
    assert "loaded the cached plan" in caplog.text
    assert "torch.compile's partitioner:" not in caplog.text
    assert (second.plan.R == first.plan.R).all() and (second.plan.S == first.plan.S).all()
