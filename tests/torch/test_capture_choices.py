"""Which captures a compiled step plans, in which order (`checkmate.executors`: `Executor.capture_choices`).

The end-to-end oracles (gradients against eager, the allocator within the plan, the leaner capture used only below
the first capture's floor) are in test_inductor.py and test_lean_backward.py.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable

import pytest
import torch
from torch import nn

import checkmate
from checkmate import zoo
from checkmate.executors import CaptureChoice, EagerExecutor, executor_named
from checkmate.executors.capture_options import CaptureOptions
from checkmate.torch_capture.trace import LossFunction
from checkmate.training import planning


def _convolutional() -> nn.Module:
    return zoo.resnet(batch_size=2, image_size=8, width=4, blocks=(1,))[0]


def _dense() -> nn.Module:
    return zoo.gpt(batch_size=2, length=4, dim=8, heads=2, layers=1, vocab=8)[0]


@pytest.mark.parametrize(
    ("executor", "channels_last", "model", "expected"),
    [
        ("inductor", None, _convolutional, [(True, False), (False, False), (False, True)]),
        ("inductor", None, _dense, [(False, False), (False, True)]),
        ("inductor", True, _convolutional, [(True, False), (True, True)]),
        ("inductor", False, _convolutional, [(False, False), (False, True)]),
        ("eager", None, _convolutional, [(False, False)]),
        ("eager", True, _convolutional, [(True, False)]),
    ],
    ids=["inductor-auto-cnn", "inductor-auto-dense", "inductor-cl", "inductor-contiguous", "eager", "eager-cl"],
)
def test_captures_are_tried_fastest_first(
    executor: str,
    channels_last: bool | None,
    model: Callable[[], nn.Module],
    expected: list[tuple[bool, bool]],
) -> None:
    choices = executor_named(executor).capture_choices(channels_last, model())
    assert [(choice.channels_last, choice.lean_backward) for choice in choices] == expected


@pytest.mark.parametrize(
    ("executor", "cost_model", "expected"),
    [
        ("eager", "profile", CaptureOptions("profile", 64, gradient_memory="when_made")),
        ("inductor", "profile", CaptureOptions("flops", 64, gradient_memory="when_made", fused=True)),
        ("inductor", "unit", CaptureOptions("unit", 64, gradient_memory="when_made", fused=True)),
    ],
)
def test_each_executor_captures_with_its_options(executor: str, cost_model: str, expected: CaptureOptions) -> None:
    """The Inductor executor captures fused ops and prices them itself (FLOPs in capture when it profiles); each
    choice keeps the executor's options and sets only whether the backward is the leaner one."""
    options = executor_named(executor).capture_options(cost_model, max_nodes=64, gradient_memory="when_made")
    assert options == expected
    for choice in executor_named(executor).capture_choices(None, _dense()):
        assert choice.options(options) == dataclasses.replace(expected, lean_backward=choice.lean_backward)


@dataclasses.dataclass(frozen=True)
class _Padded(CaptureChoice):
    """A capture whose step also does much useless arithmetic: every plan of it costs more than the plain one's."""

    def traced_loss(self, model: nn.Module, loss_fn: LossFunction) -> LossFunction:
        def padded(model: nn.Module, x: torch.Tensor, *rest: object) -> torch.Tensor:
            useless = x.repeat(1, 16) @ torch.ones(16 * x.shape[1], 512)
            return loss_fn(model, x, *rest) + 0.0 * useless.tanh().sum()

        return padded


def test_a_capture_that_cannot_beat_the_best_plan_is_not_searched(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """Captures are searched cheapest without recomputation first: the padded one, offered first, is prepared but
    not searched, since every node once already costs more than the plain capture's plan."""
    padded, plain = _Padded(False, False, "padded"), CaptureChoice(False, False, "plain")
    monkeypatch.setattr(EagerExecutor, "capture_choices", lambda *_: (padded, plain))
    searched: list[str] = []
    solve_capture = planning._solve_capture
    monkeypatch.setattr(
        planning,
        "_solve_capture",
        lambda model, prepared, *rest: (
            searched.append(prepared.choice.description) or solve_capture(model, prepared, *rest)
        ),
    )
    model, loss_fn, batch = zoo.mlp(batch_size=8)
    with caplog.at_level(logging.INFO, logger="checkmate.training.planning"):
        step = checkmate.compile(model, loss_fn, batch, budget=0.6, cost_model="flops", cache=False)
    assert searched == ["plain"]
    assert "padded: every node once costs" in caplog.text and "not searched" in caplog.text
    assert step.report().planning_times.captures == 2  # type: ignore[union-attr]
    plain_loss = loss_fn(model, *batch)
    assert torch.equal(step(*batch), plain_loss.detach())
