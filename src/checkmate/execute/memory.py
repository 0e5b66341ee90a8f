"""Measure the peak of live tensor bytes while a step runs, on the same terms as the plan's peak.

What is counted, and why it is comparable with `Plan.peak_memory`:

* The plan's peak is the graph's fixed memory (parameters, buffers, the batch, gradients and buffer
  updates) plus the exported values of the live graph nodes, each storage once, views free, plus what the
  nodes run so far retain (gradients under `gradient_memory="when_made"`, saved generator states).
* The measurement starts from the distinct storages of the tensors that are live when the step starts
  and that the plan counts as fixed (`baseline`: parameters, buffers, the batch, existing `.grad`s)
  and adds every storage the step allocates while it is alive.

On CPU a TorchDispatchMode sees every ATen op's outputs as they are made; a new storage is counted
at once and uncounted by a weakref finalizer when it dies, so the peak is exact at op granularity. It does
not see memory a kernel allocates and frees inside itself, nor generator states saved outside ATen ops; the
plan counts both (scratch under the "profile" cost model), so on CPU this meter reads at or below the plan by
them (`checkmate.torch_capture.allocator.allocator_peak` reads the allocator itself). On CUDA the figure is
`torch.cuda.max_memory_allocated` over the step, minus what was allocated before it, plus the
baseline: it includes the caching allocator's rounding to 512-byte blocks and library workspaces
(cuDNN, cuBLAS), which the plan counts only as far as the profiled per-op scratch saw them, so there it can
exceed the plan's peak.

Values computed inside a node and not exported are alive while the node runs, and a gradient accumulated
into an existing `.grad` is alive beside it until it has been added; the plan counts both in the node's
workspace.
"""

from __future__ import annotations

import logging
import weakref
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

from checkmate.torch_capture.allocator import memory_profile, peak_above_start

log = logging.getLogger(__name__)


def storage_bytes(tensors: Iterable[torch.Tensor]) -> int:
    """Bytes of the distinct storages behind `tensors` (views and repeats counted once)."""
    seen: dict[tuple[str, int], int] = {}
    for tensor in tensors:
        storage = tensor.untyped_storage()
        seen[(str(tensor.device), storage.data_ptr())] = storage.nbytes()
    return sum(seen.values())


class PeakMeter:
    """The result of a measurement: `peak_bytes` is set when the measured block ends."""

    def __init__(self) -> None:
        self.peak_bytes = 0


class _LiveStorages(TorchDispatchMode):
    """Counts the bytes of live storages created by ATen ops, each storage once, and keeps the peak."""

    def __init__(self, baseline: Sequence[torch.Tensor]) -> None:
        super().__init__()
        self.live: dict[int, int] = {}
        self.finalizers: list[weakref.finalize] = []
        self.current = 0
        self.peak = 0
        for tensor in baseline:
            self._track(tensor)

    def __torch_dispatch__(self, func: Callable[..., Any], types: Any, args: Any = (), kwargs: Any = None) -> Any:
        result = func(*args, **(kwargs or {}))
        for value in tree_leaves(result):
            if isinstance(value, torch.Tensor):
                self._track(value)
        return result

    def _track(self, tensor: torch.Tensor) -> None:
        storage = tensor.untyped_storage()
        key = storage.data_ptr()
        size = storage.nbytes()
        if size == 0 or key in self.live:
            return
        self.live[key] = size
        self.current += size
        self.peak = max(self.peak, self.current)
        self.finalizers.append(weakref.finalize(storage, self._release, key))

    def _release(self, key: int) -> None:
        self.current -= self.live.pop(key)

    def detach_all(self) -> None:
        """Stop watching: the finalizers of storages that outlive the step must not keep this object alive."""
        for finalizer in self.finalizers:
            finalizer.detach()
        self.finalizers.clear()


@contextmanager
def measure_peak(
    device: torch.device, baseline: Sequence[torch.Tensor], *, allocator: bool = False
) -> Iterator[PeakMeter]:
    """Measure the peak of live tensor bytes inside the `with` block.

    Args:
        device: where the step runs ("cpu" counts allocations as they happen; "cuda" reads the allocator).
        baseline: the tensors alive at the start that the plan counts as fixed memory.
        allocator: on CPU, read the allocator's own events (`checkmate.torch_capture.allocator`) instead of
            watching ATen ops: it also sees kernel scratch and what compiled code allocates outside the dispatcher
            (Inductor's buffers), at the price of a profiler session.

    Example:
        >>> with measure_peak(torch.device("cpu"), list(model.parameters())) as meter:
        ...     loss_fn(model, *batch).backward()
        >>> meter.peak_bytes
    """
    meter = PeakMeter()
    if device.type == "cuda":
        with _measure_cuda(device, baseline, meter):
            yield meter
        return
    if allocator:
        with memory_profile() as profiler:
            yield meter
        meter.peak_bytes = peak_above_start(profiler) + storage_bytes(baseline)
        return
    mode = _LiveStorages(baseline)
    try:
        with mode:
            yield meter
    finally:
        mode.detach_all()
    meter.peak_bytes = mode.peak


@contextmanager
def _measure_cuda(device: torch.device, baseline: Sequence[torch.Tensor], meter: PeakMeter) -> Iterator[None]:
    torch.cuda.synchronize(device)
    torch.cuda.reset_peak_memory_stats(device)
    before = torch.cuda.memory_allocated(device)
    yield
    torch.cuda.synchronize(device)
    peak = torch.cuda.max_memory_allocated(device)
    meter.peak_bytes = peak - before + storage_bytes(t for t in baseline if t.is_cuda)


def synchronize(device: torch.device) -> None:
    """Wait for the device's queued work (CUDA); nothing to wait for on CPU. Timers and meters call it around a step."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def eager_peak(model: torch.nn.Module, loss_fn: Callable[..., torch.Tensor], batch: Sequence[Any]) -> int:
    """Measured peak of one plain `loss_fn(model, *batch).backward()`, counted as `measure_peak` counts.

    The gradients it leaves are added into the parameters' `.grad`, as a real step would.
    """
    baseline = step_baseline(model, batch)
    device = baseline[0].device if baseline else torch.device("cpu")
    with measure_peak(device, baseline) as meter:
        loss_fn(model, *batch).backward()
    return meter.peak_bytes


def step_baseline(model: torch.nn.Module, batch: Sequence[Any]) -> list[torch.Tensor]:
    """The tensors a step starts with that the plan counts as fixed: parameters, their grads, buffers, batch."""
    tensors: list[torch.Tensor] = []
    for parameter in model.parameters():
        tensors.append(parameter)
        if parameter.grad is not None:
            tensors.append(parameter.grad)
    tensors.extend(model.buffers())
    tensors.extend(leaf for leaf in tree_leaves(list(batch)) if isinstance(leaf, torch.Tensor))
    return tensors
