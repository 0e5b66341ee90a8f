"""Which executor runs a compiled step's plan, and what each needs from capture.

* "eager": each planning node's ATen ops, one by one, as captured (gradients bit for bit eager's).
* "inductor": each planning node as one Inductor-compiled function (`checkmate.inductor`); capture groups ops as
  Inductor fuses them, and the plan is priced by the compiled functions as measured (time, and the allocator's
  bytes during each call), so the budget holds for what runs.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from checkmate.captured import Captured
from checkmate.errors import InvalidArgument
from checkmate.execute.interpreter import Program, prepare
from checkmate.torch_capture import model_device
from checkmate.torch_capture.channels_last import channels_last_step, has_convolutions
from checkmate.torch_capture.trace import LossFunction, flatten_batch

log = logging.getLogger(__name__)

EXECUTORS = ("eager", "inductor")


def check_executor(executor: str) -> None:
    """Raise InvalidArgument unless `executor` is one of EXECUTORS."""
    if executor not in EXECUTORS:
        raise InvalidArgument(f"executor must be one of {EXECUTORS}, got {executor!r}")


def capture_options(executor: str, cost_model: str) -> dict[str, Any]:
    """Capture options for `executor`: the Inductor executor groups fused ops, and prices them itself when profiled
    (so capture only counts FLOPs instead of timing ATen ops that will not run)."""
    if executor == "inductor":
        return {"fused": True, "cost_model": "flops" if cost_model == "profile" else cost_model}
    return {"cost_model": cost_model}


@dataclass(frozen=True)
class LeanerCapture:
    """Capture options that reach smaller budgets at some cost in time, tried when the first capture cannot fit.

    Attributes:
        options: added to the executor's capture options.
        description: what they change, for the log.
    """

    options: dict[str, Any]
    description: str


def leaner_capture(executor: str) -> LeanerCapture | None:
    """The executor's leaner capture, or None. For "inductor": ReLU and max-pool backward reading a 2-byte mask and a
    shape (`checkmate.torch_capture.lean_backward`): smaller floors (VGG's full-size one 18.17 -> 16.17 MiB), at the
    cost of making the masks, so it is tried only for budgets the first capture cannot meet."""
    if executor == "inductor":
        return LeanerCapture({"lean_backward": True}, "ReLU and max-pool backward reading masks and shapes")
    return None


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
