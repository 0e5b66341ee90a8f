"""Which captures a compiled step plans, in which order (`checkmate.executors`: `Executor.capture_choices`).

The end-to-end oracles (gradients against eager, the allocator within the plan, the leaner capture used only below
the first capture's floor) are in test_inductor.py and test_lean_backward.py.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import pytest
from torch import nn

from checkmate import zoo
from checkmate.executors import executor_named
from checkmate.executors.capture_options import CaptureOptions


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
