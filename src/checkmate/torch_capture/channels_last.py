"""Channels-last activations for convolutional models, as Inductor's layout optimization chooses them.

`torch.compile` runs a model with 2-D convolutions in channels-last layout (`torch._inductor.config.
layout_optimization`): oneDNN's and cuDNN's convolutions, forward and backward, are faster on it. Per-node
compilation cannot make that choice, because every node must return its values in the layout the trace gave them.
So the layout is chosen before the trace (`checkmate.compile(..., channels_last=True)`): the step converts its 4-D
floating-point batch tensors to channels-last first, and the convolutions propagate that layout through the whole
graph. Parameters keep their layout (a convolution reads a contiguous weight as it is; its gradient comes out in the
weight's layout).

It is a choice of numerics as well as of speed: on CPU, oneDNN's channels-last convolutions round differently. On
the full-size CNNs of `benchmarks/peers.py`, eager PyTorch's float32 gradients in channels-last are much further from
the float64 ones than contiguous float32 ones are, and `torch.compile`'s drift from eager on those models is the same
effect (`benchmarks/investigations/layout_numerics.py`).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn
from torch.utils import _pytree as pytree

from checkmate.torch_capture.trace import LossFunction


def has_convolutions(model: nn.Module) -> bool:
    """Whether the model has a 2-D convolution (or transposed convolution): the case layout optimization is for."""
    return any(isinstance(module, nn.Conv2d | nn.ConvTranspose2d) for module in model.modules())


def channels_last_step(loss_fn: LossFunction) -> LossFunction:
    """`loss_fn` with its 4-D floating-point batch tensors converted to channels-last inside the step."""

    def step(model: nn.Module, *batch: Any) -> torch.Tensor:
        return loss_fn(model, *pytree.tree_map(_channels_last, batch))

    return step


def _channels_last(value: Any) -> Any:
    if isinstance(value, torch.Tensor) and value.dim() == 4 and value.is_floating_point():
        return value.contiguous(memory_format=torch.channels_last)
    return value
