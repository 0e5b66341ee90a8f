"""Parameters as real models have them: tied, reached under two paths, frozen, unused; buffers left alone.

The oracle is eager PyTorch on a deep copy (deepcopy keeps ties): the same loss, `.grad` set or left as eager sets
or leaves it, the same buffers, over steps that start from no `.grad` and that accumulate. The fixed memory is
checked against the bytes a tied tensor and its gradient take, counted once.
"""

from __future__ import annotations

import copy
from typing import Any

import pytest
import torch
from eager_oracle import assert_same_state, measured_call
from torch import nn

import checkmate
from checkmate.training.compiled import CompiledStep

VOCAB, WIDTH, LENGTH = 11, 6, 5


class TiedLanguageModel(nn.Module):
    """An embedding whose matrix is also the output layer (GPT-2), a frozen layer, a head the loss never reads,
    a layer reached under two names (T5's shared embedding), a parameter read only under no_grad, and buffers
    of which one is never updated."""

    def __init__(self, *, tied: bool = True) -> None:
        super().__init__()
        self.embedding = nn.Embedding(VOCAB, WIDTH)
        self.mixer = nn.Linear(WIDTH, WIDTH)
        self.same_mixer = self.mixer
        self.frozen = nn.Linear(WIDTH, WIDTH)
        self.frozen.requires_grad_(False)
        self.unused_head = nn.Linear(WIDTH, 3)
        self.scale = nn.Parameter(torch.tensor(0.5))
        self.norm = nn.BatchNorm1d(WIDTH)
        self.register_buffer("constant_bias", torch.linspace(-1.0, 1.0, WIDTH))
        self.output = nn.Linear(WIDTH, VOCAB, bias=False)
        if tied:
            self.output.weight = self.embedding.weight

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        hidden = self.embedding(tokens) + self.constant_bias
        hidden = torch.tanh(self.same_mixer(self.frozen(hidden)))
        hidden = self.norm(hidden.flatten(0, 1)).unflatten(0, tokens.shape)
        with torch.no_grad():
            damping = self.scale * 2.0
        hidden = self.mixer(hidden) * damping
        return self.output(hidden)


def _loss(model: nn.Module, tokens: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    return nn.functional.cross_entropy(model(tokens).flatten(0, 1), targets.flatten())


def _batch(seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    tokens = torch.randint(0, VOCAB, (4, LENGTH), generator=generator)
    return tokens, torch.randint(0, VOCAB, (4, LENGTH), generator=generator)


def _step_both(step: CompiledStep, reference: nn.Module, batch: tuple[Any, ...], context: str) -> None:
    loss, measured = measured_call(step, batch)
    expected = _loss(reference, *batch)
    expected.backward()
    assert torch.equal(loss, expected.detach()), f"{context}: loss differs"
    assert_same_state(step.model, reference, context)
    planned = step.plan.peak_memory
    assert measured <= planned, f"{context}: the allocator held {measured} bytes, above the plan's {planned}"


@pytest.mark.parametrize("budget", [1.0, 0.75])
def test_tied_frozen_unused_and_aliased_parameters_match_eager(budget: float) -> None:
    torch.manual_seed(0)
    model = TiedLanguageModel()
    reference = copy.deepcopy(model)
    step = checkmate.compile(
        model, _loss, _batch(1), budget=budget, cost_model="profile", cache=False, measure_memory="never", time_limit=10
    )
    _step_both(step, reference, _batch(1), "first step")
    for optimizer in (torch.optim.SGD(m.parameters(), lr=0.1) for m in (model, reference)):
        optimizer.step()
    _step_both(step, reference, _batch(2), "accumulating step")
    assert model.output.weight is model.embedding.weight, "the step must not untie the model"
    assert model.unused_head.weight.grad is None and model.frozen.weight.grad is None
    assert model.scale.grad is None, "a parameter read only under no_grad gets no gradient in eager"
    assert model.embedding.weight.grad is not None


def test_a_tied_tensor_is_one_input_with_one_gradient_counted_once() -> None:
    batch = _batch(1)
    tied = checkmate.capture(TiedLanguageModel(tied=True), _loss, batch, cost_model="unit")
    untied = checkmate.capture(TiedLanguageModel(tied=False), _loss, batch, cost_model="unit")
    assert "output.weight" in untied.parameter_names and "output.weight" not in tied.parameter_names
    assert tied.parameter_names.count("embedding.weight") == 1
    assert "same_mixer.weight" not in tied.parameter_names
    matrix_bytes = VOCAB * WIDTH * 4
    assert untied.graph.fixed_memory - tied.graph.fixed_memory == 2 * matrix_bytes, "weight and gradient, once each"
    gradient_of = dict(zip(tied.parameter_names, tied.gradients, strict=True))
    assert gradient_of["unused_head.weight"] is None and gradient_of["frozen.weight"] is None
    assert gradient_of["scale"] is None and gradient_of["embedding.weight"] is not None


def test_a_tied_model_profiles() -> None:
    """The profiler reads each lifted tensor from the model by name (it once looked up the tie's second name)."""
    captured = checkmate.capture(TiedLanguageModel(), _loss, _batch(1), cost_model="profile")
    assert all(node.cost > 0 for node in captured.graph.nodes)


class ChannelsLastNorm(nn.Module):
    """Batch norm over a transposed view: CPU's kernel returns a contiguous output where the traced (meta) one kept
    the input's strides, so the traced graph's `view` of it fails unless the executor restores the traced layout."""

    def __init__(self) -> None:
        super().__init__()
        self.embedding = nn.Embedding(VOCAB, WIDTH)
        self.norm = nn.BatchNorm1d(WIDTH)
        self.output = nn.Linear(WIDTH, VOCAB)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        hidden = self.norm(self.embedding(tokens).transpose(1, 2)).transpose(1, 2)
        return self.output(hidden)


def test_a_kernel_that_lays_out_its_output_otherwise_than_traced_still_matches_eager(
    caplog: pytest.LogCaptureFixture,
) -> None:
    torch.manual_seed(0)
    model = ChannelsLastNorm()
    reference = copy.deepcopy(model)
    with caplog.at_level("WARNING", logger="checkmate.execute.program"):
        step = checkmate.compile(model, _loss, _batch(1), budget=1.0, cost_model="profile", cache=False)
        loss = step(*_batch(1))
    expected = _loss(reference, *_batch(1))
    expected.backward()
    assert torch.equal(loss, expected.detach())
    assert_same_state(model, reference, "transposed batch norm")
    assert "copied into the traced layout" in caplog.text


def test_a_loss_without_trainable_parameters_is_refused() -> None:
    model = TiedLanguageModel()
    model.requires_grad_(False)
    with pytest.raises(checkmate.CaptureError, match="no parameter of the model requires a gradient"):
        checkmate.capture(model, _loss, _batch(1), cost_model="unit")
