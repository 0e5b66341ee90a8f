"""The eager executor: each planning node's ATen ops, one by one, as captured; gradients bit for bit eager's."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from torch import nn

from checkmate.captured import Captured
from checkmate.execute.program import Program, prepare
from checkmate.executors.capture_options import CaptureOptions
from checkmate.executors.protocol import CaptureChoice
from checkmate.options import CostModel, ExecutorName, GradientMemory
from checkmate.strategies.held_start import HeldStart


@dataclass(frozen=True)
class EagerExecutor:
    """Runs the captured ATen ops; one capture, in the model's layout unless `channels_last=True`."""

    name: ExecutorName = "eager"
    metered_by_allocator: bool = False
    reuses_plans_across_shapes: bool = True

    def capture_options(
        self, cost_model: CostModel, *, max_nodes: int | None, gradient_memory: GradientMemory
    ) -> CaptureOptions:
        return CaptureOptions(cost_model, max_nodes, gradient_memory=gradient_memory)

    def capture_choices(self, channels_last: bool | None, model: nn.Module) -> tuple[CaptureChoice, ...]:
        layout = bool(channels_last)
        return (CaptureChoice(layout, False, "channels-last" if layout else "the model's layout"),)

    def prepare(
        self, captured: Captured, model: nn.Module, batch: Sequence[Any], cost_model: CostModel
    ) -> tuple[Captured, Program]:
        return captured, prepare(captured)

    def extra_starts(self, captured: Captured, budget: int) -> tuple[HeldStart, ...]:
        """None: the search's own starts."""
        return ()
