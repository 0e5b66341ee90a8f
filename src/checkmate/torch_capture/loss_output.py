"""What `loss_fn` returns: the scalar loss, or a structure holding it beside other values (logits, metrics).

Hugging Face models return a `ModelOutput` (an OrderedDict with a `loss` entry when labels are given), and training
code often returns `(loss, logits)`. `split_loss_output` finds the loss in such a result: the result itself when it is
a tensor, the first entry of a tuple or list, the `loss` entry of a dict or ModelOutput (else its first). The other
tensors become outputs of the traced step, detached (as eager code reads them after `loss.backward()`), and
`LossOutput.rebuild` puts the step's loss and outputs back into the same structure; values that are not tensors
(None, numbers, strings) are kept as traced.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch.utils import _pytree as pytree

from checkmate.errors import CaptureError

_NEEDS = (
    "loss_fn must return the scalar loss, or a tuple or list whose first entry is the loss, or a dict or Hugging Face "
    "ModelOutput with a `loss` entry"
)
_CONSTANTS = (type(None), bool, int, float, complex, str)


@dataclass(frozen=True)
class Loss:
    """The place of the loss in the result."""


@dataclass(frozen=True)
class Output:
    """The place of the step's other output number `index`."""

    index: int


@dataclass(frozen=True)
class Constant:
    """A value that is not a tensor, kept as traced."""

    value: Any


Slot = Loss | Output | Constant


@dataclass(frozen=True)
class LossOutput:
    """How loss_fn's result is rebuilt from the step's loss and its other outputs.

    Attributes:
        spec: the result's pytree spec.
        slots: what fills each of its leaves.
    """

    spec: pytree.TreeSpec
    slots: tuple[Slot, ...]

    @property
    def is_loss(self) -> bool:
        """Whether loss_fn returns the loss itself (nothing to rebuild)."""
        return self.spec.is_leaf()

    def rebuild(self, loss: torch.Tensor, outputs: Sequence[torch.Tensor]) -> Any:
        """The result, with `loss` and `outputs` in their places."""
        if self.is_loss:
            return loss
        return pytree.tree_unflatten([_fill(slot, loss, outputs) for slot in self.slots], self.spec)


def split_loss_output(result: Any) -> tuple[torch.Tensor, list[torch.Tensor], LossOutput]:
    """The loss in `result`, its other tensors (detached), and how to rebuild `result` from them.

    Raises:
        CaptureError: `result` holds no loss where one is expected, or a value a step cannot return.
    """
    loss = _find_loss(result)
    paths_and_leaves, spec = pytree.tree_flatten_with_path(result)
    slots: list[Slot] = []
    others: list[torch.Tensor] = []
    position: dict[int, int] = {}
    for path, leaf in paths_and_leaves:
        if leaf is loss:
            slots.append(Loss())
        elif isinstance(leaf, torch.Tensor):
            if id(leaf) not in position:
                position[id(leaf)] = len(others)
                others.append(leaf.detach())
            slots.append(Output(position[id(leaf)]))
        elif isinstance(leaf, _CONSTANTS):
            slots.append(Constant(leaf))
        else:
            raise CaptureError(
                f"loss_fn returned a {type(leaf).__name__} at {pytree.keystr(path) or 'the top'}, which a compiled "
                "step cannot return: return only tensors beside the loss (for a Hugging Face model, pass "
                "use_cache=False, or return the loss and the logits)"
            )
    return loss, others, LossOutput(spec, tuple(slots))


def _find_loss(result: Any) -> torch.Tensor:
    if isinstance(result, torch.Tensor):
        loss: Any = result
    elif isinstance(result, Mapping):
        loss = result["loss"] if "loss" in result else next(iter(result.values()), None)
    elif isinstance(result, tuple | list):
        loss = result[0] if result else None
    else:
        raise CaptureError(f"{_NEEDS}; it returned {_describe(result)}")
    if not isinstance(loss, torch.Tensor):
        raise CaptureError(f"{_NEEDS}; it returned a {type(result).__name__} whose loss entry is {_describe(loss)}")
    if loss.numel() != 1:
        raise CaptureError(
            f"{_NEEDS}; its loss has shape {tuple(loss.shape)}: reduce it to a scalar (e.g. .mean()), and for a "
            "Hugging Face model pass the labels"
        )
    return loss


def _describe(value: Any) -> str:
    return "None" if value is None else f"a {type(value).__name__}"


def _fill(slot: Slot, loss: torch.Tensor, outputs: Sequence[torch.Tensor]) -> Any:
    if isinstance(slot, Loss):
        return loss
    if isinstance(slot, Output):
        return outputs[slot.index]
    return slot.value
