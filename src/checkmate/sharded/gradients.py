"""The gradient sink of a sharded step: each gradient into its full parameter's `.grad` as eager autograd adds it
under FSDP2, each unit reduced by FSDP2's own post-backward, and FSDP2's end-of-backward at the end.

Eager FSDP2 lets AccumulateGrad add each gradient into the gathered (unsharded) parameter's `.grad`; the unit's
post-backward then reduce-scatters those gradients into the sharded parameters' `.grad` (DTensors), with FSDP2's
own arithmetic (`foreach_reduce`: the division by the world size, accumulation into an existing sharded `.grad`),
or, after `set_requires_gradient_sync(False)`, keeps them on the unsharded parameters for the next step. The sink
does the first part itself (one `GradientAccumulator` per unit) and calls FSDP2's `post_backward` for the rest, at
the place `checkmate.sharded.timeline` gives each unit's REDUCE; so the sharded `.grad` is eager FSDP2's bit for bit.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

import torch

import checkmate.sharded.fsdp2 as fsdp2
from checkmate.execute.gradients import GradientAccumulator
from checkmate.sharded.units import Unit

log = logging.getLogger(__name__)


class ShardedGradients:
    """Accumulates each gradient into its full parameter's `.grad`, and reduces a unit when told (`reduce`).

    Args:
        parameters: the full parameters in the captured step's placeholder order.
        unit_of: the unit of each of them (an index into `units`).
        units: the model's units.
    """

    def __init__(self, parameters: Sequence[torch.Tensor], unit_of: Sequence[int], units: Sequence[Unit]) -> None:
        self.units = units
        self.unit_of = unit_of
        self.accumulators = [GradientAccumulator(parameters) for _ in units]
        self.reduced = [False] * len(units)

    def __call__(self, index: int, gradient: torch.Tensor) -> None:
        self.accumulators[self.unit_of[index]](index, gradient)

    def reduce(self, unit: int) -> None:
        """The unit's post-backward: its gradients in the parameters' layout, then FSDP2 reduces and reshards."""
        self.accumulators[unit].finish()
        fsdp2.post_backward(self.units[unit].group)
        self.reduced[unit] = True

    def finish(self) -> None:
        """FSDP2's end of backward (`_root_post_backward_final_callback`): the post-backward of every unit the step
        did not reduce, every unit idle again, and on the last backward its pending reductions waited for."""
        for unit, done in zip(self.units, self.reduced, strict=True):
            if not done:
                fsdp2.post_backward(unit.group)
        fsdp2.finish_backward((unit.module, unit.group) for unit in self.units)
