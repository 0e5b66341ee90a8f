"""Where a step's parameter gradients go: into `.grad`, added exactly as eager autograd's AccumulateGrad adds them.

A schedule's step function (`checkmate.execute.program`) calls a sink as `sink(parameter_index, gradient)` the
moment the schedule computes that gradient, and the compiled step calls `sink.finish()` once the schedule has run.
`GradientAccumulator` is the sink of a single-process step; `checkmate.data_parallel` wraps it to all-reduce the
gradients across ranks as DDP does. `WithBatchGradients` adds the gradients of batch tensors that require one.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Protocol

import torch

log = logging.getLogger(__name__)


class StepGradients(Protocol):
    """A gradient sink with an end: called once per gradient as the schedule makes it, then `finish()` once."""

    def __call__(self, index: int, gradient: torch.Tensor) -> None: ...

    def finish(self) -> None: ...


class GradientAccumulator:
    """Adds each gradient into `.grad` as eager AccumulateGrad does: in place when a `.grad` exists, else taken.

    A taken gradient that fills its storage gets the parameter's layout (eager's layout contract) only in
    `finish`, when the step is done: copying it while the activations are live would hold one more gradient
    than the plan counts. One that is a piece of a larger storage is copied at once, to let that storage go.
    """

    def __init__(self, parameters: Sequence[torch.Tensor]) -> None:
        self.parameters = parameters
        self.taken: list[torch.Tensor] = []

    def __call__(self, index: int, gradient: torch.Tensor) -> None:
        parameter = self.parameters[index]
        if parameter.grad is None and _fills_storage(gradient):
            parameter.grad = gradient
            self.taken.append(parameter)
        elif parameter.grad is None:
            parameter.grad = _in_layout_of(parameter, gradient)
        else:
            parameter.grad.add_(gradient)

    def finish(self) -> None:
        for parameter in self.taken:
            assert parameter.grad is not None
            parameter.grad = _in_layout_of(parameter, parameter.grad)


class WithBatchGradients:
    """A step's sink for its parameters' gradients (`parameters`, indices below `count`) and then its batch tensors'
    (index `count + i` for batch tensor i), as eager's `loss.backward()` treats each: a leaf tensor's gradient is
    added into its `.grad` as AccumulateGrad adds it; a tensor made by autograd from others (a non-leaf) passes its
    gradient back through the graph that made it when the step ends (`torch.autograd.backward`)."""

    def __init__(self, parameters: StepGradients, count: int, batch: Sequence[torch.Tensor]) -> None:
        self.parameters = parameters
        self.count = count
        self.batch = batch
        self.leaves = GradientAccumulator(batch)
        self.carried: list[tuple[torch.Tensor, torch.Tensor]] = []

    def __call__(self, index: int, gradient: torch.Tensor) -> None:
        if index < self.count:
            self.parameters(index, gradient)
        elif self.batch[index - self.count].is_leaf:
            self.leaves(index - self.count, gradient)
        else:
            self.carried.append((self.batch[index - self.count], gradient))

    def finish(self) -> None:
        self.parameters.finish()
        self.leaves.finish()
        if self.carried:
            tensors, gradients = zip(*self.carried, strict=True)
            torch.autograd.backward(list(tensors), list(gradients))


def _in_layout_of(parameter: torch.Tensor, gradient: torch.Tensor) -> torch.Tensor:
    """The gradient itself when it has the parameter's strides and owns its storage, else a copy that has them."""
    if gradient.stride() == parameter.stride() and _fills_storage(gradient):
        return gradient
    copy = torch.empty_strided(parameter.shape, parameter.stride(), dtype=gradient.dtype, device=gradient.device)
    return copy.copy_(gradient)


def _fills_storage(tensor: torch.Tensor) -> bool:
    return tensor.storage_offset() == 0 and tensor.untyped_storage().nbytes() == tensor.numel() * tensor.element_size()
