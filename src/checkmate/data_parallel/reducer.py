"""The gradient sink of a data-parallel step: DDP's Reducer, driven by the schedule instead of autograd hooks."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

from checkmate.captured import Captured
from checkmate.data_parallel.buckets import Bucket, BucketSlot
from checkmate.errors import ExecutionError
from checkmate.execute.gradients import GradientAccumulator

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Reduction:
    """How a data-parallel step reduces gradients: the process group, its size, and the buckets in launch order."""

    group: dist.ProcessGroup
    world_size: int
    buckets: tuple[Bucket, ...]

    @property
    def bucket_bytes(self) -> int:
        """Bytes of all the buckets, which the plan holds in its fixed memory."""
        return sum(bucket.numel * bucket.dtype.itemsize for bucket in self.buckets)


class BucketedGradients:
    """The gradient sink of a data-parallel step: accumulate locally, average into buckets, all-reduce each bucket
    as soon as it is complete, and write the results into `.grad` at the end (see `checkmate.data_parallel`).

    A bucket slot whose parameter gets no gradient in this step holds zeros, and its `.grad` is left as it was."""

    def __init__(self, parameters: Sequence[torch.Tensor], captured: Captured, reduction: Reduction) -> None:
        self.local = GradientAccumulator(parameters)
        self.parameters = parameters
        self.reduction = reduction
        index_of = {name: index for index, name in enumerate(captured.parameter_names)}
        self.place: dict[int, tuple[int, BucketSlot]] = {}
        self.unused: list[list[BucketSlot]] = []
        self.waiting: list[int] = []
        for number, bucket in enumerate(reduction.buckets):
            unused = []
            for slot in bucket.slots:
                index = index_of.get(slot.name)
                if index is None or captured.gradients[index] is None:
                    unused.append(slot)
                else:
                    self.place[index] = (number, slot)
            self.unused.append(unused)
            self.waiting.append(len(bucket.slots) - len(unused))
        self.flat: list[torch.Tensor | None] = [None] * len(reduction.buckets)
        self.works: list[Any] = []

    def __call__(self, index: int, gradient: torch.Tensor) -> None:
        self.local(index, gradient)
        place = self.place.get(index)
        if place is None:
            return
        number, slot = place
        accumulated = self.parameters[index].grad
        assert accumulated is not None
        # the Reducer's mark_variable_ready_dense: multiply by 1/world_size while copying into the bucket
        torch.mul(accumulated, 1.0 / self.reduction.world_size, out=slot.view(self._flat(number)))
        self.waiting[number] -= 1
        self._launch_ready()

    def finish(self) -> None:
        self._launch_ready()
        if len(self.works) < len(self.reduction.buckets):
            raise ExecutionError(
                f"internal: {sum(self.waiting)} gradients never came from the schedule (per bucket: {self.waiting}); "
                "please report this model"
            )
        for work in self.works:
            work.wait()
        self.local.finish()
        for index, (number, slot) in self.place.items():
            gradient = self.parameters[index].grad
            assert gradient is not None
            gradient.copy_(slot.view(self._flat(number)))
        self.flat = [None] * len(self.flat)

    def _launch_ready(self) -> None:
        """Start the all-reduce of each complete bucket, in bucket order: every rank starts them in that order."""
        while len(self.works) < len(self.reduction.buckets) and self.waiting[len(self.works)] == 0:
            flat = self._flat(len(self.works))
            self.works.append(dist.all_reduce(flat, group=self.reduction.group, async_op=True))

    def _flat(self, number: int) -> torch.Tensor:
        flat = self.flat[number]
        if flat is None:
            bucket = self.reduction.buckets[number]
            flat = torch.empty(bucket.numel, dtype=bucket.dtype, device=bucket.device)
            for slot in self.unused[number]:
                slot.view(flat).zero_()
            self.flat[number] = flat
        return flat
