"""Measure an eager training step: peak live tensor bytes and wall time. The oracle for a capture.

Peak memory is counted at the level the planning graph models, tensor storages, independently of
the capture code: a TorchDispatchMode sees every ATen op of the step (forward and backward), records
the storage of each output with a weak reference, and after each op sums the storages still alive.
Bytes live before the step (parameters, buffers, the batch) are added once. What the CPU allocator
does beyond that (workspaces inside a kernel, fragmentation, caching) is not counted.

Three totals come out. `peak_bytes` is what eager PyTorch holds in a step from `.grad = None`.
`peak_gradients_fixed` charges parameter gradients for the whole step (they are part of
`Graph.fixed_memory`) and leaves the storages that end up as `.grad` out of the step's live set.
`peak_accumulating` is what eager holds in a second step that adds into the first one's `.grad`s: every
gradient is live for the whole step and each new one is a temporary until it has been added. That is
the planning graph's convention exactly (a node's workspace counts the gradients it makes).
"""

from __future__ import annotations

import logging
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn
from torch.multiprocessing.reductions import StorageWeakRef
from torch.utils import _pytree as pytree
from torch.utils._python_dispatch import TorchDispatchMode

from checkmate.torch_capture.sizes import tensors_of

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class EagerMeasurement:
    """Peak live storage bytes of one eager step (preexisting bytes included) and its median wall time.

    Attributes:
        peak_bytes: preexisting_bytes plus the largest total of storages created by the step and alive at once.
        peak_gradients_fixed: preexisting_bytes plus all gradient bytes plus the largest total of the
            other storages created by the step and alive at once.
        peak_accumulating: preexisting_bytes plus all gradient bytes plus the largest total of storages alive at
            once in a second step that accumulates into the first one's `.grad`s.
        preexisting_bytes: parameters, buffers and batch tensors.
        gradient_bytes: the parameters' `.grad` storages after the step.
        step_seconds: median wall time of `loss_fn(model, *batch).backward()` (0.0 when not timed).
        fastest_step_seconds: the fastest of those runs (0.0 when not timed).
    """

    peak_bytes: int
    peak_gradients_fixed: int
    peak_accumulating: int
    preexisting_bytes: int
    gradient_bytes: int
    step_seconds: float
    fastest_step_seconds: float


class LiveStorageMeter(TorchDispatchMode):
    """Tracks the storages created by ATen ops; `snapshots` holds the live set right after each op.

    Storages of `preexisting` tensors (parameters, inputs) are never counted, even when an op returns
    a view of them.
    """

    def __init__(self, preexisting: Sequence[torch.Tensor] = ()) -> None:
        super().__init__()
        self.ignored = {tensor.untyped_storage()._cdata for tensor in preexisting}
        self.live: dict[int, tuple[StorageWeakRef, int, int]] = {}
        self.total = 0
        self.peak = 0
        self.snapshots: list[dict[int, int]] = []
        self._created = 0

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        output = func(*args, **(kwargs or {}))
        self._forget_freed()
        for tensor in tensors_of(output):
            storage = tensor.untyped_storage()
            if storage._cdata not in self.live and storage._cdata not in self.ignored and storage.nbytes() > 0:
                self.live[storage._cdata] = (StorageWeakRef(storage), int(storage.nbytes()), self._created)
                self._created += 1
                self.total += int(storage.nbytes())
        self.peak = max(self.peak, self.total)
        self.snapshots.append({serial: size for _, size, serial in self.live.values()})
        return output

    def serials(self, tensors: Sequence[torch.Tensor]) -> set[int]:
        """The creation serial numbers of the live storages of `tensors` (storage addresses get reused)."""
        return {self.live[key][2] for tensor in tensors if (key := tensor.untyped_storage()._cdata) in self.live}

    def _forget_freed(self) -> None:
        for key in [key for key, (reference, _, _) in self.live.items() if reference.expired()]:
            self.total -= self.live.pop(key)[1]

    def peak_without(self, excluded: set[int]) -> int:
        """The largest live total after an op, leaving out the storages in `excluded`."""
        return max(
            (sum(size for key, size in snapshot.items() if key not in excluded) for snapshot in self.snapshots),
            default=0,
        )


def measure_eager_step(
    model: nn.Module,
    loss_fn: Callable[..., torch.Tensor],
    batch: Sequence[Any],
    *,
    repeats: int = 0,
) -> EagerMeasurement:
    """Run `loss_fn(model, *batch).backward()` once under the meter, then `repeats` timed runs (median)."""
    model.zero_grad(set_to_none=True)
    state = [*model.parameters(), *model.buffers(), *pytree.tree_leaves(tuple(batch))]
    preexisting = _distinct_bytes(state)
    inputs = [tensor for tensor in state if isinstance(tensor, torch.Tensor)]
    meter = LiveStorageMeter(inputs)
    with meter:
        loss_fn(model, *batch).backward()
    gradients = [parameter.grad for parameter in model.parameters() if parameter.grad is not None]
    meter._forget_freed()
    gradient_keys = meter.serials(gradients)
    gradient_bytes = _distinct_bytes(gradients)
    accumulating = LiveStorageMeter([*inputs, *gradients])
    with accumulating:
        loss_fn(model, *batch).backward()
    del gradients
    model.zero_grad(set_to_none=True)
    timings = [_timed_step(model, loss_fn, batch) for _ in range(repeats)]
    return EagerMeasurement(
        peak_bytes=preexisting + meter.peak,
        peak_gradients_fixed=preexisting + gradient_bytes + meter.peak_without(gradient_keys),
        peak_accumulating=preexisting + gradient_bytes + accumulating.peak,
        preexisting_bytes=preexisting,
        gradient_bytes=gradient_bytes,
        step_seconds=statistics.median(timings) if timings else 0.0,
        fastest_step_seconds=min(timings, default=0.0),
    )


def _timed_step(model: nn.Module, loss_fn: Callable[..., torch.Tensor], batch: Sequence[Any]) -> float:
    model.zero_grad(set_to_none=True)
    started = time.perf_counter()
    loss_fn(model, *batch).backward()
    elapsed = time.perf_counter() - started
    model.zero_grad(set_to_none=True)
    return elapsed


def _distinct_bytes(tensors: Sequence[Any]) -> int:
    storages = {
        tensor.untyped_storage()._cdata: tensor.untyped_storage().nbytes()
        for tensor in tensors
        if isinstance(tensor, torch.Tensor)
    }
    return int(sum(storages.values()))
