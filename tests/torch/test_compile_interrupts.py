"""Ctrl-C during `checkmate.compile`: during the search, the best plan within a second, cached with the seconds it
searched (not as a full-effort plan), and no further capture planned; during capture, KeyboardInterrupt at once."""

from __future__ import annotations

import json
import os
import random
import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from torch import nn

import checkmate
from checkmate.executors import CaptureChoice, EagerExecutor
from checkmate.plan_cache import cache_directory
from checkmate.progress import Progress
from checkmate.simulate import simulate


class RandomSkips(nn.Module):
    """Layer i multiplies its output by a random earlier one: a graph whose retention MILP takes seconds."""

    def __init__(self, depth: int) -> None:
        super().__init__()
        rng = random.Random(0)
        self.layers = nn.ModuleList(nn.Linear(16, 16) for _ in range(depth))
        self.skips = [rng.randrange(0, i + 1) for i in range(depth)]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        outputs = [x]
        for layer, skip in zip(self.layers, self.skips, strict=True):
            outputs.append(torch.tanh(layer(outputs[-1])) * outputs[skip])
        return outputs[-1]


def _loss(model: nn.Module, x: torch.Tensor) -> torch.Tensor:
    return model(x).square().mean()


@pytest.mark.serial
def test_ctrl_c_during_compile_s_search_returns_the_best_plan_within_a_second_cached_with_its_seconds(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CHECKMATE_CACHE_DIR", str(tmp_path))
    # Two captures to plan, as the Inductor executor has: the second is not planned once Ctrl-C stopped the first.
    layout = CaptureChoice(False, False, "the model's layout")
    monkeypatch.setattr(EagerExecutor, "capture_choices", lambda *_: (layout, layout))
    torch.manual_seed(0)
    model = RandomSkips(50)
    sent: list[float] = []

    def on_progress(snapshot: Progress) -> None:
        if snapshot.phase == "baselines" and not sent:
            sent.append(0.0)
            threading.Timer(
                0.5, lambda: (sent.append(time.perf_counter()), os.kill(os.getpid(), signal.SIGINT))
            ).start()

    step = checkmate.compile(
        model,
        _loss,
        (torch.randn(512, 16),),
        budget=0.5,
        cost_model="flops",
        executor="eager",
        planning_time_limit=60.0,
        progress=on_progress,
    )
    assert len(sent) == 2 and time.perf_counter() - sent[1] < 1.0
    plan, graph = step.plan, step.graph
    cost, peak = simulate(graph, plan.R, plan.S)
    assert peak <= plan.budget and cost == pytest.approx(plan.cost)
    [entry] = [json.loads(path.read_text()) for path in cache_directory().glob("*.json")]
    assert entry["effort"]["time_limit"] == pytest.approx(plan.solve_time) and plan.solve_time < 30.0


@pytest.fixture
def keyboard_interrupt_on_sigint() -> Iterator[None]:
    """Ctrl-C as a terminal delivers it. A shell that starts pytest in the background makes it ignore SIGINT, and a
    process that starts with SIGINT ignored has no KeyboardInterrupt handler (the CI runner, a `make test &`)."""
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, previous)


@pytest.mark.serial  # a 5 s wall-clock bound on a trace that takes about 3 s on a busy machine
@pytest.mark.usefixtures("keyboard_interrupt_on_sigint")
def test_ctrl_c_during_capture_raises_keyboard_interrupt(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CHECKMATE_CACHE_DIR", str(tmp_path))

    sent: list[bool] = []

    def interrupted_loss(model: nn.Module, x: torch.Tensor) -> torch.Tensor:
        if not sent:  # one Ctrl-C, while the step is traced
            sent.append(True)
            signal.raise_signal(signal.SIGINT)
        return _loss(model, x)

    started = time.perf_counter()
    with pytest.raises(KeyboardInterrupt):
        checkmate.compile(RandomSkips(3), interrupted_loss, (torch.randn(4, 16),), budget=0.5, cost_model="flops")
    assert time.perf_counter() - started < 5.0
