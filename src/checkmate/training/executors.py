"""Which executor runs a compiled step's plan, and what each needs from capture.

* "eager": each planning node's ATen ops, one by one, as captured (gradients bit for bit eager's).
* "inductor": each planning node as one Inductor-compiled function (`checkmate.inductor`); capture groups ops as
  Inductor fuses them, and the plan is priced by the compiled functions as measured (time, and the allocator's
  bytes during each call), so the budget holds for what runs.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from checkmate.captured import Captured
from checkmate.errors import InvalidArgument
from checkmate.execute.program import Program, prepare
from checkmate.options import CostModel, GradientMemory
from checkmate.torch_capture import model_device
from checkmate.torch_capture.channels_last import channels_last_step, has_convolutions
from checkmate.torch_capture.trace import LossFunction, flatten_batch
from checkmate.training.capture_options import CaptureOptions

log = logging.getLogger(__name__)

EXECUTORS = ("eager", "inductor")


def check_executor(executor: str) -> None:
    """Raise InvalidArgument unless `executor` is one of EXECUTORS."""
    if executor not in EXECUTORS:
        raise InvalidArgument(f"executor must be one of {EXECUTORS}, got {executor!r}")


def capture_options(
    executor: str, cost_model: CostModel, *, max_nodes: int | None, gradient_memory: GradientMemory
) -> CaptureOptions:
    """Capture options for `executor`: the Inductor executor groups fused ops, and prices them itself when profiled
    (so capture only counts FLOPs instead of timing ATen ops that will not run)."""
    if executor == "inductor":
        captured_cost_model: CostModel = "flops" if cost_model == "profile" else cost_model
        return CaptureOptions(captured_cost_model, max_nodes, gradient_memory=gradient_memory, fused=True)
    return CaptureOptions(cost_model, max_nodes, gradient_memory=gradient_memory)


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


def capture_choices(executor: str, channels_last: bool | None, model: nn.Module) -> tuple[CaptureChoice, ...]:
    """The captures to plan, fastest first when nothing is recomputed (`plan_step` plans the next one when the budget
    is below what one can reach, or when its plan recomputes, and keeps the plan of least predicted cost).

    For "inductor": with `channels_last=None` (auto), a model with 2-D convolutions is traced channels-last first, as
    `torch.compile`'s layout optimization runs it, then in its own layout; last comes the leaner capture of the last
    layout, whose ReLU and max-pool backward read a 2-byte mask and a shape (`checkmate.torch_capture.lean_backward`;
    VGG's full-size floor 18.17 -> 16.17 MiB, at the cost of making the masks). For "eager": one capture, in the
    model's layout unless `channels_last=True`."""
    if channels_last is None:
        layouts = [True, False] if executor == "inductor" and has_convolutions(model) else [False]
    else:
        layouts = [channels_last]
    choices = [CaptureChoice(layout, False, "channels-last" if layout else "the model's layout") for layout in layouts]
    if executor == "inductor":
        choices.append(CaptureChoice(layouts[-1], True, "ReLU and max-pool backward reading masks and shapes"))
    return tuple(choices)


def traced_loss(channels_last: bool, model: nn.Module, loss_fn: LossFunction) -> LossFunction:
    """The step capture traces: with `channels_last`, a convolutional model's batch converted to channels-last inside
    the step (`checkmate.torch_capture.channels_last`)."""
    if channels_last and has_convolutions(model):
        return channels_last_step(loss_fn)
    if channels_last:
        log.info("channels_last: the model has no 2-D convolution; its batch is traced as it is")
    return loss_fn


def prepare_executor(
    executor: str, captured: Captured, model: nn.Module, batch: Sequence[Any], cost_model: str
) -> tuple[Captured, Program]:
    """The capture as the executor prices it, and the executor's program."""
    if executor == "eager":
        return captured, prepare(captured)
    from checkmate.inductor import prepare_inductor  # imports torch._inductor: only for this executor

    state = dict(model.named_parameters()) | dict(model.named_buffers())
    inputs = [
        *(state[name].detach() for name in captured.parameter_names),
        *(state[name] for name in captured.buffer_names),
        *flatten_batch(batch)[0],
    ]
    with torch.no_grad():
        prepared = prepare_inductor(captured, inputs, device=model_device(model), reprice_costs=cost_model == "profile")
    return prepared.captured, prepared.program
