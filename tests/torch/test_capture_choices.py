"""Which captures a compiled step plans, in which order (`checkmate.training.executors.capture_choices`).

The end-to-end oracles (gradients against eager, the allocator within the plan, the leaner capture used only below
the first capture's floor) are in test_inductor.py and test_lean_backward.py.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from torch import nn

from checkmate import zoo
from checkmate.training.executors import capture_choices

LEAN = {"lean_backward": True}


def _convolutional() -> nn.Module:
    return zoo.resnet(batch_size=2, image_size=8, width=4, blocks=(1,))[0]


def _dense() -> nn.Module:
    return zoo.gpt(batch_size=2, length=4, dim=8, heads=2, layers=1, vocab=8)[0]


@pytest.mark.parametrize(
    ("executor", "channels_last", "model", "expected"),
    [
        ("inductor", None, _convolutional, [(True, {}), (False, {}), (False, LEAN)]),
        ("inductor", None, _dense, [(False, {}), (False, LEAN)]),
        ("inductor", True, _convolutional, [(True, {}), (True, LEAN)]),
        ("inductor", False, _convolutional, [(False, {}), (False, LEAN)]),
        ("eager", None, _convolutional, [(False, {})]),
        ("eager", True, _convolutional, [(True, {})]),
    ],
    ids=["inductor-auto-cnn", "inductor-auto-dense", "inductor-cl", "inductor-contiguous", "eager", "eager-cl"],
)
def test_captures_are_tried_fastest_first(
    executor: str,
    channels_last: bool | None,
    model: Callable[[], nn.Module],
    expected: list[tuple[bool, dict[str, Any]]],
) -> None:
    choices = capture_choices(executor, channels_last, model())
    assert [(choice.channels_last, choice.options) for choice in choices] == expected
