"""The Inductor executor: each planning node runs as one Inductor-compiled function (`checkmate.inductor`).

Capture groups ops as Inductor fuses them, and the plan is priced by the compiled functions as measured (time, and
the allocator's bytes during each call), so the budget holds for what runs; runs of a solved schedule are compiled
as one function each where they measure within the plan (its schedule pass, `checkmate.inductor.segments.FuseRuns`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from checkmate.captured import Captured
from checkmate.execute.program import Program
from checkmate.executors.capture_options import CaptureOptions
from checkmate.executors.protocol import CaptureChoice
from checkmate.options import CostModel, ExecutorName, GradientMemory
from checkmate.strategies.held_start import HeldStart
from checkmate.torch_capture import model_device
from checkmate.torch_capture.channels_last import has_convolutions
from checkmate.torch_capture.trace import flatten_batch


@dataclass(frozen=True)
class InductorExecutor:
    """Runs Inductor-compiled functions of the planning nodes and of runs of the schedule."""

    name: ExecutorName = "inductor"
    metered_by_allocator: bool = True
    reuses_plans_across_shapes: bool = False  # each shape's nodes are compiled and measured: that is its planning

    def capture_options(
        self, cost_model: CostModel, *, max_nodes: int | None, gradient_memory: GradientMemory
    ) -> CaptureOptions:
        """Fused ops; priced by the compiled functions when profiled, so capture only counts FLOPs then."""
        captured_cost_model: CostModel = "flops" if cost_model == "profile" else cost_model
        return CaptureOptions(captured_cost_model, max_nodes, gradient_memory=gradient_memory, fused=True)

    def capture_choices(self, channels_last: bool | None, model: nn.Module) -> tuple[CaptureChoice, ...]:
        """With `channels_last=None` (auto), a model with 2-D convolutions is traced channels-last first, as
        `torch.compile`'s layout optimization runs it, then in its own layout; last comes the leaner capture of the
        last layout, whose ReLU and max-pool backward read a 2-byte mask and a shape
        (`checkmate.torch_capture.lean_backward`), at the cost of making the masks."""
        automatic = [True, False] if has_convolutions(model) else [False]
        layouts = automatic if channels_last is None else [channels_last]
        choices = [CaptureChoice(each, False, "channels-last" if each else "the model's layout") for each in layouts]
        choices.append(CaptureChoice(layouts[-1], True, "ReLU and max-pool backward reading masks and shapes"))
        return tuple(choices)

    def prepare(
        self, captured: Captured, model: nn.Module, batch: Sequence[Any], cost_model: CostModel
    ) -> tuple[Captured, Program]:
        """Compile and measure every node on the model's tensors and the batch."""
        from checkmate.inductor import prepare_inductor  # imports torch._inductor (seconds): only when this runs

        state = dict(model.named_parameters()) | dict(model.named_buffers())
        inputs = [
            *(state[name].detach() for name in captured.parameter_names),
            *(state[name] for name in captured.buffer_names),
            *flatten_batch(batch)[0],
        ]
        with torch.no_grad():
            prepared = prepare_inductor(
                captured, inputs, device=model_device(model), reprice_costs=cost_model == "profile"
            )
        return prepared.captured, prepared.program

    def extra_starts(self, captured: Captured, budget: int) -> tuple[HeldStart, ...]:
        """torch.compile's partitioner's saved sets near the budget (`checkmate.inductor.partitioner_start`)."""
        from checkmate.inductor.partitioner_start import partitioner_starts  # torch._inductor, as `prepare`'s

        return partitioner_starts(captured, budget)
