"""Batch shapes after compile: the budget is the bytes resolved at compile, and a smaller batch of the same graph runs
the plan of a larger one at once (no profiling, no solve), with eager's gradients and within those bytes.

The oracle is eager `loss_fn(model, *batch).backward()` on a deep copy of the model, stepped by the same SGD; the
compiled step meters its own peak (`measure_memory="every"`), which must stay within the compile's bytes.
"""

from __future__ import annotations

import copy
import dataclasses
import logging
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
import torch
from eager_oracle import assert_equal, assert_same_state
from torch import nn

import checkmate
import checkmate.torch_capture
import checkmate.training.compiled
import checkmate.training.distribution
from checkmate import InfeasibleBudget, zoo
from checkmate.byte_sizes import resolve_budget

pytestmark = pytest.mark.usefixtures("module_cache_directory")

WIDTH, CLASSES = 64, 10


def mlp(batch_size: int) -> tuple[nn.Module, Any, tuple[torch.Tensor, ...]]:
    """Ten Linear+ReLU layers of 64: at 60 % of its no-remat peak the plan recomputes."""
    return zoo.mlp(batch_size=batch_size, width=WIDTH, depth=10, classes=CLASSES)


def new_batch(size: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    return torch.randn(size, WIDTH, generator=generator), torch.randint(0, CLASSES, (size,), generator=generator)


def counting(monkeypatch: pytest.MonkeyPatch, owner: Any, name: str) -> list[int]:
    """Count the calls of `owner.name` from now on."""
    calls: list[int] = []
    real: Callable[..., Any] = getattr(owner, name)

    def counted(*args: Any, **kwargs: Any) -> Any:
        calls.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(owner, name, counted)
    return calls


def step_both(
    step: checkmate.training.compiled.CompiledStep,
    reference: nn.Module,
    optimizers: list[torch.optim.Optimizer],
    batch: tuple[torch.Tensor, ...],
    context: str,
) -> None:
    """One compiled and one eager step on `batch` under the same seed: equal loss and gradients; then an SGD update
    of both."""
    torch.manual_seed(0)
    loss = step(*batch)
    torch.manual_seed(0)
    expected = step.loss_fn(reference, *batch)
    expected.backward()
    assert_equal(loss, expected.detach(), f"{context}: loss {loss.item()} != {expected.item()}")
    assert_same_state(step.model, reference, context)
    for optimizer in optimizers:
        optimizer.step()
        optimizer.zero_grad()


def test_smaller_last_batch_runs_the_first_plan_within_its_bytes(monkeypatch: pytest.MonkeyPatch) -> None:
    model, loss_fn, batch = mlp(256)
    reference = copy.deepcopy(model)
    step = checkmate.compile(
        model, loss_fn, batch, budget=0.6, method="approx", time_limit=5, cost_model="profile", measure_memory="every"
    )
    first = step.plan
    budget = resolve_budget(0.6, step.report().no_remat_peak)
    assert first.recomputes and first.budget == budget == step.report().budget
    planned = counting(monkeypatch, checkmate.training.distribution, "plan_step")
    profiled = counting(monkeypatch, checkmate.torch_capture, "profile_per_op")
    optimizers = [torch.optim.SGD(m.parameters(), lr=0.1) for m in (model, reference)]
    for index, data in enumerate([batch, new_batch(256, 1), new_batch(256, 2), new_batch(100, 3)]):
        step_both(step, reference, optimizers, data, f"step {index}, batch of {len(data[0])}")
        measured = step.report().measured_peak
        assert measured is not None and measured <= budget, f"step {index}: measured {measured} of {budget} bytes"
    assert step.captured.batch_shapes[0][0] == (100, WIDTH)
    assert planned == [] and profiled == [], "the batch of 100 was planned: the step stalled"
    assert np.array_equal(step.plan.R, first.R) and np.array_equal(step.plan.S, first.S)
    report = step.report()
    assert report.budget == budget and report.planned_peak <= budget
    assert report.reused_from == "float32[256, 64], int64[256]"
    assert "the plan of batch float32[256, 64]" in str(report)


def test_a_fraction_is_resolved_once_for_every_shape() -> None:
    model, loss_fn, batch = mlp(100)
    step = checkmate.compile(model, loss_fn, batch, budget=0.9, method="approx", time_limit=5, cost_model="flops")
    budget = resolve_budget(0.9, step.report().no_remat_peak)
    assert step.plan.budget == budget
    step(*new_batch(128, 1))
    assert step.captured.batch_shapes[0][0] == (128, WIDTH)
    assert step.plan.budget == step.report().budget == budget, "the larger batch must plan within the same bytes"
    assert step.plan.peak_memory <= budget
    with pytest.raises(InfeasibleBudget, match=r"batch float32\[512, 64\].*fixed in bytes at compile") as refusal:
        step(*new_batch(512, 2))
    assert refusal.value.budget == budget


class ByBatchSize(nn.Module):
    """A model whose graph depends on the batch size: ReLU from 8 rows, tanh below."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.first = nn.Linear(16, 16)
        self.second = nn.Linear(16, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        hidden = self.first(x)
        hidden = torch.relu(hidden) if x.shape[0] >= 8 else torch.tanh(hidden)
        return self.second(hidden)


def cross_entropy(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return nn.functional.cross_entropy(model(x), y)


def test_another_graph_structure_is_planned_for_itself(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    model = ByBatchSize()
    reference = copy.deepcopy(model)
    generator = torch.Generator().manual_seed(0)
    batch = (torch.randn(8, 16, generator=generator), torch.randint(0, 4, (8,), generator=generator))
    step = checkmate.compile(model, cross_entropy, batch, budget=1.0, method="checkpoint_all", cost_model="unit")
    planned = counting(monkeypatch, checkmate.training.distribution, "plan_step")
    optimizers = [torch.optim.SGD(m.parameters(), lr=0.1) for m in (model, reference)]
    with caplog.at_level(logging.INFO, logger="checkmate.training.compiled"):
        step_both(step, reference, optimizers, tuple(tensor[:4].clone() for tensor in batch), "batch of 4")
    assert planned == [1], "a graph of another structure is planned for its shape"
    assert step.report().reused_from is None
    assert "its graph differs from that of batch float32[8, 16]" in caplog.text


def test_improve_replaces_the_reused_plan(monkeypatch: pytest.MonkeyPatch) -> None:
    model, loss_fn, batch = mlp(256)
    reference = copy.deepcopy(model)
    step = checkmate.compile(model, loss_fn, batch, budget=0.6, method="approx", time_limit=5, cost_model="flops")
    budget = step.report().budget
    optimizers = [torch.optim.SGD(m.parameters(), lr=0.1) for m in (model, reference)]
    small = new_batch(100, 1)
    step_both(step, reference, optimizers, small, "batch of 100, reused plan")
    reused = step.plan
    assert step.report().reused_from is not None and reused.recomputes
    planned = counting(monkeypatch, checkmate.training.distribution, "plan_step")
    improved = step.improve(*small)
    assert planned == [1]
    assert step.plan is improved and step.report().reused_from is None
    assert improved.budget == budget and improved.cost < reused.cost
    assert not improved.recomputes, "the batch of 100 fits the compile's bytes without recomputing"
    step_both(step, reference, optimizers, small, "batch of 100, its own plan")
    assert step.improve(*small) is improved and planned == [1], "a shape planned for itself is not planned again"


def test_a_shorter_sequence_runs_the_longer_ones_plan() -> None:
    """A shorter sequence changes the sizes views are given, not the graph's structure."""
    model, loss_fn, batch = zoo.gpt(batch_size=4, length=32, dim=32, heads=2, layers=2, vocab=64)
    reference = copy.deepcopy(model)
    step = checkmate.compile(model, loss_fn, batch, budget=0.8, method="chen_greedy", cost_model="flops")
    first = step.plan
    optimizers = [torch.optim.SGD(m.parameters(), lr=0.1) for m in (model, reference)]
    step_both(step, reference, optimizers, tuple(tensor[:, :16].clone() for tensor in batch), "length 16")
    assert step.report().reused_from == "int64[4, 32], int64[4, 32]"
    assert np.array_equal(step.plan.R, first.R) and np.array_equal(step.plan.S, first.S)


def test_a_capture_for_another_shape_keeps_the_recompute_costs_of_the_one_it_is_priced_by() -> None:
    """`capture_as` prices a smaller batch by a planned capture's costs: its recomputations' too (a plan run at the
    new shape is priced as it was planned)."""
    model, loss_fn, batch = mlp(8)
    like = checkmate.torch_capture.capture(model, loss_fn, batch, cost_model="flops")
    halved = [dataclasses.replace(node, recompute_cost=node.cost / 2) for node in like.graph.nodes]
    like = dataclasses.replace(like, graph=dataclasses.replace(like.graph, nodes=tuple(halved)))
    trace = checkmate.torch_capture.trace_prepared(model, loss_fn, new_batch(4, seed=1))
    captured = checkmate.torch_capture.capture_as(
        like, trace, optimizer_state_bytes=0, gradient_memory="whole_step", device=torch.device("cpu")
    )
    assert np.array_equal(captured.graph.recompute_costs, like.graph.recompute_costs)
    assert np.array_equal(captured.graph.costs, like.graph.costs)
