"""The model's state as the step reads it: each parameter and buffer tensor once, and which parameters get a gradient.

Real models share tensors. GPT-2's output layer is its token embedding (one Parameter in two modules), and T5
reaches one embedding module under four paths. `named_parameters(remove_duplicate=False)` lists such a tensor
under every name, and AOTAutograd would lift each name as its own graph input: one tensor counted twice in the
fixed memory, gradients split between names, and names whose copy the model never reads (AOTAutograd then stops
with "Found a parameter that did not receive a gradient"). Here each tensor is lifted once, under its first name
(the name `named_parameters()` gives it), so autograd sums its gradient inside the traced step as eager does.

A trainable parameter that the loss does not depend on (a head the loss skips, a parameter read only under
`no_grad`) gets no gradient in eager, and its `.grad` stays as it was. Such parameters are found with one
forward and backward on the fake model and traced as constants.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass

import torch
from torch import nn

from checkmate.errors import CaptureError


@dataclass(frozen=True)
class ModelState:
    """The distinct tensors of a model, each under its first name.

    Attributes:
        parameters: first name -> parameter, in `named_parameters()` order.
        buffers: first name -> buffer, in `named_buffers()` order.
        aliases: every other name of a parameter or buffer -> its first name.
    """

    parameters: dict[str, nn.Parameter]
    buffers: dict[str, torch.Tensor]
    aliases: dict[str, str]


def distinct_state(model: nn.Module) -> ModelState:
    """Each parameter and buffer of `model` once, and the other names it is known by."""
    parameters = dict(model.named_parameters())
    buffers = dict(model.named_buffers())
    first_name = {id(tensor): name for name, tensor in [*parameters.items(), *buffers.items()]}
    every_name = [*model.named_parameters(remove_duplicate=False), *model.named_buffers(remove_duplicate=False)]
    aliases = {name: first_name[id(tensor)] for name, tensor in every_name if first_name[id(tensor)] != name}
    return ModelState(parameters=parameters, buffers=buffers, aliases=aliases)


def parameters_without_gradient(
    loss_of: Callable[[], torch.Tensor], parameters: Mapping[str, torch.Tensor]
) -> frozenset[str]:
    """Names of the trainable parameters that the loss `loss_of()` does not depend on (no gradient in eager); other
    tensors that require a gradient (batch tensors) may be among `parameters`.

    `loss_of` runs the forward on fake tensors, so this costs one traced forward and backward, no real memory.
    """
    trainable = {name: parameter for name, parameter in parameters.items() if parameter.requires_grad}
    if not trainable:
        raise CaptureError("no parameter of the model requires a gradient: there is no training step to plan")
    loss = loss_of()
    if not loss.requires_grad:
        raise CaptureError(
            "the loss does not depend on any trainable parameter (was it computed under torch.no_grad(), or "
            "detached?): there is no backward pass to plan"
        )
    gradients = torch.autograd.grad(loss, list(trainable.values()), allow_unused=True)
    return frozenset(name for name, gradient in zip(trainable, gradients, strict=True) if gradient is None)
