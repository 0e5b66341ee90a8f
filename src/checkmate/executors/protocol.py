"""What an executor is: the part of a compiled step that turns a capture into code and runs a plan's schedule.

An executor decides how the step is captured (its capture options and the captures to plan, fastest first), what
the capture becomes before planning (`prepare`: the Program that runs schedules, and the capture as the executor
prices it), and how a metered call measures its peak. The step (`checkmate.training.compiled.CompiledStep`) and the
planning path (`checkmate.training.planning`) call only this protocol; `checkmate.executors` lists the members.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from torch import nn

from checkmate.captured import Captured
from checkmate.execute.program import Program
from checkmate.executors.capture_options import CaptureOptions
from checkmate.options import CostModel, ExecutorName, GradientMemory
from checkmate.strategies.held_start import HeldStart
from checkmate.torch_capture.channels_last import channels_last_step, has_convolutions
from checkmate.torch_capture.trace import LossFunction

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class CaptureChoice:
    """One way to capture the step: the layout it traces and whether its backward is the leaner one.

    Attributes:
        channels_last: trace a convolutional model's batch converted to channels-last (`traced_loss`).
        lean_backward: capture with `CaptureOptions.lean_backward`.
        description: what it is, for the log.
    """

    channels_last: bool
    lean_backward: bool
    description: str

    def options(self, executor_options: CaptureOptions) -> CaptureOptions:
        """The executor's capture options as this choice captures."""
        return dataclasses.replace(executor_options, lean_backward=self.lean_backward)

    def traced_loss(self, model: nn.Module, loss_fn: LossFunction) -> LossFunction:
        """The step capture traces: with `channels_last`, a convolutional model's batch converted to channels-last
        inside the step (`checkmate.torch_capture.channels_last`)."""
        if self.channels_last and has_convolutions(model):
            return channels_last_step(loss_fn)
        if self.channels_last:
            log.info("channels_last: the model has no 2-D convolution; its batch is traced as it is")
        return loss_fn


class Executor(Protocol):
    """Runs a plan's schedule over a captured step.

    Attributes:
        name: how `checkmate.compile(..., executor=...)` names it.
        metered_by_allocator: a metered call reads the allocator's events (code that allocates outside the tensors
            Python sees, such as compiled kernels), not only the live tensors (`checkmate.execute.memory`).
        reuses_plans_across_shapes: a new batch shape may run the plan of a larger one without preparing its own
            capture (`checkmate.training.shape_reuse`); False where preparing is what makes the shape run.
    """

    @property
    def name(self) -> ExecutorName: ...

    @property
    def metered_by_allocator(self) -> bool: ...

    @property
    def reuses_plans_across_shapes(self) -> bool: ...

    def capture_options(
        self, cost_model: CostModel, *, max_nodes: int | None, gradient_memory: GradientMemory
    ) -> CaptureOptions:
        """The options the step is captured with."""
        ...

    def capture_choices(self, channels_last: bool | None, model: nn.Module) -> tuple[CaptureChoice, ...]:
        """The captures to plan, the likely fastest first (`checkmate.training.planning.plan_step` prepares the next
        one while none fits the budget without recomputation, and searches them cheapest first)."""
        ...

    def prepare(
        self, captured: Captured, model: nn.Module, batch: Sequence[Any], cost_model: CostModel
    ) -> tuple[Captured, Program]:
        """The capture as this executor prices it, and the Program that runs its schedules (with the executor's
        schedule passes, `checkmate.execute.passes`)."""
        ...

    def extra_starts(self, captured: Captured, budget: int) -> tuple[HeldStart, ...]:
        """Starting plans the search weighs beside its own for the prepared capture within `budget` bytes (the
        Inductor executor's: torch.compile's own choices, so that ours is never worse than they are)."""
        ...
