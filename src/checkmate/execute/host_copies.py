"""A plan's moves to host memory as the step runs them: its copies out and back placed among the schedule's steps,
and run beside the compute (`checkmate.moved` says what the moves mean for memory and time).

The schedule pass `HostMoves` (order PLACE, in every Program) reads `Schedule.moves` and places four kinds of step:

* `StartCopyOut(i, t)`, where `copy_out[t, i]`: right after `Compute(i, t)`, or at the start of stage t when node i
  is held there; it starts copying node i's exported values to host memory (unless the plan never copies them back).
* `EndCopyOut(i, t)`: before the first `Free` of node i after it (the simulator frees a value being copied out at the
  end of its stage at the earliest), so the device value lives until its copy is complete, as the plan counts it.
* `StartCopyIn(i, t)`, where `copy_in[t, i]`: at the start of the first stage of its buffer's run (`buffered`, the
  stage t - 1 or earlier); it allocates node i's device storages (the buffer the plan counts through the run) and
  starts copying the host copy into them.
* `EndCopyIn(i, t)`: at the start of stage t; it waits for the copy, and node i's values become a live copy, read
  and freed as a computed one is.

Copies are of whole storages, byte for byte, and values are rebuilt as views of the new storages with their dtype,
shape, strides and offset, so a moved value is bit-equal to the one computed, aliasing between a node's exports
included. Host copies stay allocated for the next step (one per moved node and storage).

How copies run (`HostCopier`):

* On CUDA, host copies are pinned; each direction has its side stream, which waits for the compute stream where the
  copy starts (its source, or its destination's allocation), and the compute stream waits on the copy's event where
  it ends: nothing blocks the host.
* On CPU, host memory is a domain the device meter does not count: host copies are numpy arrays, outside PyTorch's
  allocator (which `checkmate.execute.memory` reads with `allocator=True`) and made off the step's thread (whose
  dispatch mode is the other meter). Each direction has a worker thread that copies (PyTorch's copy releases the
  interpreter lock), and the step waits for it where the copy must end; the worker lets go of the device values
  before it signals, so a value dies where the step frees it.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from checkmate.errors import ExecutionError
from checkmate.execute.codegen import BODY, ScheduleItem, StepWriter, emit_step
from checkmate.execute.passes import Lowering, PassOrder, with_steps
from checkmate.simulate import Compute, Free


@dataclass(frozen=True)
class CopyStep:
    """A step of a copy of node `node`'s values, for the plan's move in stage `stage`, run by `copier` (a
    `HostCopier` in a Program; a `torch.compile` region's graphs run theirs, `checkmate.inductor.moved_region`)."""

    node: int
    stage: int
    copier: Any = field(compare=False, repr=False)


class StartCopyOut(CopyStep):
    """Start copying node `node`'s live copy to host memory (the plan's copy_out[stage, node])."""


class EndCopyOut(CopyStep):
    """Wait until node `node`'s copy out (of stage `stage`) is complete."""


class StartCopyIn(CopyStep):
    """Allocate node `node`'s storages on the device and start copying its host copy back for stage `stage`."""


@dataclass(frozen=True)
class EndCopyIn(CopyStep):
    """Wait for node `node`'s copy back for stage `stage`; its values become a live copy. The `last` copy back of
    the step lets go of the node's copy out (the values it kept by reference, not its host copies, which stay for the
    next step)."""

    last: bool = False


@dataclass(frozen=True)
class HostMoves:
    """The schedule pass that places a plan's copies to host memory and back (module doc); steps of a schedule
    without moves pass unchanged. What the copies hold on the device is in the schedule's own accounting
    (`checkmate.simulate.lower`), so `Lowering.held` and `Lowering.peak` are unchanged."""

    copier: HostCopier = field(default_factory=lambda: HostCopier(), compare=False)
    order: PassOrder = PassOrder.PLACE

    def __call__(self, lowering: Lowering) -> Lowering:
        moves = lowering.schedule.moves
        if not moves.any:
            return lowering
        T = lowering.schedule.moves.copy_out.shape[0]
        return with_steps(
            lowering, placed_copies(lowering.steps, moves.copy_out, moves.copy_in, moves.buffers(T), self.copier)
        )


def placed_copies(
    steps: Sequence[ScheduleItem], copy_out: np.ndarray, copy_in: np.ndarray, buffered: np.ndarray, copier: Any
) -> tuple[ScheduleItem, ...]:
    """`steps` with the copies of `copy_out`, `copy_in` and their `buffered` runs (bool[T, T] each) placed among them
    (module doc)."""
    T = copy_out.shape[0]
    copy_out = np.logical_and(copy_out, copy_in.any(axis=0, keepdims=True))  # never copied back: not copied
    stage_of = [step.stage if isinstance(step, Compute | Free) else None for step in steps]
    first_of_stage: dict[int, int] = {}
    for position, stage in enumerate(stage_of):
        if stage is not None:
            first_of_stage.setdefault(stage, position)
    missing = sorted(set(range(T)) - set(first_of_stage))
    if missing:
        raise ExecutionError(f"stage {missing[0]} of the schedule has no step to place its host copies at")
    computed = {(step.node, step.stage) for step in steps if isinstance(step, Compute)}
    before: dict[int, list[ScheduleItem]] = {}
    starting_runs = buffered & ~np.vstack([np.zeros((1, T), dtype=bool), buffered[:-1]])
    last_copy_in = T - 1 - np.argmax(copy_in[::-1], axis=0)
    for t in range(T):  # a stage's copies back end, then the runs of buffers start, then held values' copies out
        start = first_of_stage[t]
        before.setdefault(start, []).extend(
            EndCopyIn(i, t, copier, last=t == last_copy_in[i]) for i in np.flatnonzero(copy_in[t]).tolist()
        )
        for i in np.flatnonzero(starting_runs[t]).tolist():
            ends = np.flatnonzero(copy_in[t + 1 :, i])
            if not ends.size:
                raise ExecutionError(f"node {i}'s buffer from stage {t} ends in no copy back")
            before[start].append(StartCopyIn(i, t + 1 + int(ends[0]), copier))
    stage_starting = {position: stage for stage, position in first_of_stage.items()}
    waiting: dict[int, int] = {}  # node: the stage of its copy out, not yet awaited
    placed: list[ScheduleItem] = []
    for position, step in enumerate(steps):
        for item in before.get(position, []):
            placed.append(item)
        starting = stage_starting.get(position)
        if starting is not None:
            for node in (int(i) for i in np.flatnonzero(copy_out[starting]) if (int(i), starting) not in computed):
                placed.append(StartCopyOut(node, starting, copier))
                waiting[node] = starting
        if isinstance(step, Free) and step.node in waiting:
            placed.append(EndCopyOut(step.node, waiting.pop(step.node), copier))
        placed.append(step)
        if isinstance(step, Compute) and copy_out[step.stage, step.node]:
            placed.append(StartCopyOut(step.node, step.stage, copier))
            waiting[step.node] = step.stage
    if waiting:
        node, stage = next(iter(waiting.items()))
        raise ExecutionError(f"node {node} is copied out in stage {stage} and never freed: its copy is never awaited")
    return tuple(placed)


@emit_step.register(StartCopyOut)
def _(step: StartCopyOut, writer: StepWriter) -> None:
    node = writer.source.nodes[step.node]
    values = "".join(f"{writer.variable(name)}, " for name in node.exports)
    kept = writer.bind(tuple(name in node.leaving for name in node.exports), "c")
    writer.emit(f"{BODY}# StartCopyOut({step.node}, {step.stage})")
    writer.emit(f"{BODY}{writer.bind(step.copier.copy_out, 'f')}({step.node}, ({values}), {kept})")


@emit_step.register(EndCopyOut)
def _(step: EndCopyOut, writer: StepWriter) -> None:
    writer.emit(f"{BODY}# EndCopyOut({step.node}, {step.stage})")
    writer.emit(f"{BODY}{writer.bind(step.copier.end_copy_out, 'f')}({step.node})")


@emit_step.register(StartCopyIn)
def _(step: StartCopyIn, writer: StepWriter) -> None:
    writer.emit(f"{BODY}# StartCopyIn({step.node}, {step.stage})")
    writer.emit(f"{BODY}{writer.bind(step.copier.copy_in, 'f')}({step.node}, {step.stage})")


@emit_step.register(EndCopyIn)
def _(step: EndCopyIn, writer: StepWriter) -> None:
    writer.emit(f"{BODY}# EndCopyIn({step.node}, {step.stage})")
    writer.arrive(step.node, f"{writer.bind(step.copier.end_copy_in, 'f')}({step.node}, {step.stage}, {step.last})")


@dataclass(frozen=True)
class _Layout:
    """How a value is rebuilt from the storages copied: a tensor as a view of storage `storage`, or any other value
    as it was (`value`)."""

    storage: int | None
    dtype: torch.dtype | None = None
    size: tuple[int, ...] = ()
    stride: tuple[int, ...] = ()
    offset: int = 0
    value: Any = None


@dataclass
class Outbound:
    """One node's copy out: its values' layouts, its storages' sizes and host copies (filled by the copy on CPU), the
    device, and the copy's progress."""

    layouts: tuple[_Layout, ...]
    sizes: list[int]
    hosts: list[torch.Tensor]
    device: torch.device
    pending: _Pending


@dataclass
class _Pending:
    """A copy in flight: a worker thread's job (CPU) or the copy stream's event (CUDA)."""

    done: threading.Event | None = None
    event: Any = None
    error: BaseException | None = None


class HostCopier:
    """Runs a step's copies to host memory and back (module doc); host copies are kept for the next step."""

    def __init__(self) -> None:
        self.host_copies: dict[int, list[torch.Tensor]] = {}
        self.outbound: dict[int, Outbound] = {}
        self.inbound: dict[tuple[int, int], Inbound] = {}

    def copy_out(self, node: int, values: tuple[Any, ...], kept: tuple[bool, ...] | None = None) -> None:
        """Start copying node `node`'s `values` (its exports) to host memory; those `kept` (values that leave the
        step, which it holds anyway) are not copied, and come back as they are."""
        outbound = start_copy_out(values, kept, self.host_copies.get(node))
        self.host_copies[node] = outbound.hosts
        self.outbound[node] = outbound

    def end_copy_out(self, node: int) -> None:
        """Wait until node `node`'s copy out is complete (the compute stream waits, on CUDA)."""
        wait_for(self.outbound[node].pending, self.outbound[node].device)

    def copy_in(self, node: int, stage: int) -> None:
        """Allocate node `node`'s storages on the device and start copying its host copy into them."""
        outbound = self.outbound.get(node)
        if outbound is None:
            raise ExecutionError(f"node {node} is copied back for stage {stage} but was never copied out")
        self.inbound[(node, stage)] = start_copy_in(outbound)

    def end_copy_in(self, node: int, stage: int, last: bool = False) -> tuple[Any, ...]:
        """Wait for node `node`'s copy back for `stage`, and return its values, rebuilt on the new storages; the
        `last` copy back of the step lets go of the copy out."""
        inbound = self.inbound.pop((node, stage))
        if last:
            del self.outbound[node]
        return finish_copy_in(inbound)


@dataclass
class Inbound:
    """A copy back in flight: the copy out it reads, the device storages it fills, and its progress."""

    outbound: Outbound
    buffers: list[torch.Tensor]
    pending: _Pending


def start_copy_out(
    values: tuple[Any, ...], kept: tuple[bool, ...] | None, hosts: list[torch.Tensor] | None
) -> Outbound:
    """Start copying the storages of `values` (but those `kept`) into host copies: `hosts` when they have the
    storages' sizes (a copy of the same values in an earlier step), else new ones."""
    storages: dict[int, torch.Tensor] = {}
    layouts = []
    for position, value in enumerate(values):
        if not isinstance(value, torch.Tensor) or (kept is not None and kept[position]):
            layouts.append(_Layout(None, value=value))
            continue
        storage = _numbered(storages, value.untyped_storage(), value.device)
        layouts.append(
            _Layout(storage, value.dtype, tuple(value.shape), tuple(value.stride()), int(value.storage_offset()))
        )
    sources = list(storages.values())
    device = sources[0].device if sources else torch.device("cpu")
    sizes = [source.numel() for source in sources]
    pending = _Pending()
    if device.type == "cuda":
        if hosts is None or [host.numel() for host in hosts] != sizes:
            hosts = [torch.empty(size, dtype=torch.uint8, pin_memory=True) for size in sizes]
        pending.event = _cuda_copy(sources, hosts, device, _streams(device).to_host)
    else:
        if hosts is None or [host.numel() for host in hosts] != sizes:
            hosts = []  # made by the copy, on its worker thread
        pending.done = threading.Event()
        _lanes().to_host.submit(_cpu_copy_out(sources, hosts, sizes, pending))
    return Outbound(tuple(layouts), sizes, hosts, device, pending)


def start_copy_in(outbound: Outbound) -> Inbound:
    """Allocate the device storages of `outbound`'s values and start copying its host copies into them."""
    device = outbound.device
    buffers = [torch.empty(size, dtype=torch.uint8, device=device) for size in outbound.sizes]
    pending = _Pending()
    if device.type == "cuda":
        stream = _streams(device).to_device
        if outbound.pending.event is not None:
            stream.wait_event(outbound.pending.event)
        pending.event = _cuda_copy(outbound.hosts, buffers, device, stream)
    else:
        pending.done = threading.Event()
        _lanes().to_device.submit(_cpu_copy_in(outbound, list(buffers), pending))
    return Inbound(outbound, buffers, pending)


def finish_copy_in(inbound: Inbound) -> tuple[Any, ...]:
    """Wait for the copy back `inbound`, and return its values rebuilt on its device storages."""
    outbound = inbound.outbound
    wait_for(inbound.pending, outbound.device)
    return tuple(
        layout.value
        if layout.storage is None
        else torch.empty(0, dtype=layout.dtype, device=outbound.device).set_(
            inbound.buffers[layout.storage].untyped_storage(), layout.offset, layout.size, layout.stride
        )
        for layout in outbound.layouts
    )


def _numbered(storages: dict[int, torch.Tensor], storage: torch.UntypedStorage, device: torch.device) -> int:
    """The number of `storage` among those of a node's values, added as a byte tensor over it when new."""
    key = storage.data_ptr()
    if key not in storages:
        storages[key] = torch.empty(0, dtype=torch.uint8, device=device).set_(storage)
    return list(storages).index(key)


def wait_for(pending: _Pending, device: torch.device) -> None:
    """Wait (the compute stream, on CUDA; the step's thread, on CPU) until the copy `pending` is complete."""
    if pending.event is not None:
        torch.cuda.current_stream(device).wait_event(pending.event)
        return
    assert pending.done is not None
    pending.done.wait()
    if pending.error is not None:
        raise ExecutionError(f"a copy to or from host memory failed: {pending.error}") from pending.error


def _cuda_copy(sources: list[torch.Tensor], destinations: list[torch.Tensor], device: torch.device, stream: Any) -> Any:
    """Copy `sources` into `destinations` on `stream` after the compute stream's work so far; the copy's event."""
    stream.wait_stream(torch.cuda.current_stream(device))
    with torch.cuda.stream(stream):
        for source, destination in zip(sources, destinations, strict=True):
            destination.copy_(source, non_blocking=True)
        event = torch.cuda.Event()
        event.record(stream)
    return event


def _cpu_copy_out(
    sources: list[torch.Tensor], hosts: list[torch.Tensor], sizes: list[int], pending: _Pending
) -> Callable[[], None]:
    def copy() -> None:
        if not hosts:  # host copies are made here, off the step's thread and outside PyTorch's allocator
            hosts.extend(torch.from_numpy(np.empty(size, dtype=np.uint8)) for size in sizes)
        for source, host in zip(sources, hosts, strict=True):
            host.copy_(source)
        sources.clear()  # let go of the device values before the step may free them

    return _signalling(copy, pending)


def _cpu_copy_in(outbound: Outbound, buffers: list[torch.Tensor], pending: _Pending) -> Callable[[], None]:
    def copy() -> None:
        assert outbound.pending.done is not None
        outbound.pending.done.wait()
        if outbound.pending.error is not None:
            raise outbound.pending.error
        for host, buffer in zip(outbound.hosts, buffers, strict=True):
            buffer.copy_(host)
        buffers.clear()  # let go of the device storages: the step frees them after their last reader

    return _signalling(copy, pending)


def _signalling(copy: Callable[[], None], pending: _Pending) -> Callable[[], None]:
    def job() -> None:
        try:
            copy()
        except BaseException as error:  # handed to the step's thread, which raises it where it waits
            pending.error = error
        finally:
            assert pending.done is not None
            pending.done.set()

    return job


class _Lane:
    """A worker thread that runs copies one after another (one direction of the link)."""

    def __init__(self, name: str) -> None:
        self.jobs: queue.SimpleQueue[Callable[[], None]] = queue.SimpleQueue()
        threading.Thread(target=self._run, name=name, daemon=True).start()

    def submit(self, job: Callable[[], None]) -> None:
        self.jobs.put(job)

    def _run(self) -> None:
        while True:
            job = self.jobs.get()
            job()
            del job


@dataclass(frozen=True)
class _Lanes:
    to_host: _Lane
    to_device: _Lane


@dataclass(frozen=True)
class _Streams:
    to_host: Any
    to_device: Any


_lanes_made: list[_Lanes] = []
_streams_made: dict[torch.device, _Streams] = {}
_making = threading.Lock()


def _lanes() -> _Lanes:
    """The CPU's two copy lanes, started on first use and shared by every step of the process."""
    with _making:
        if not _lanes_made:
            _lanes_made.append(_Lanes(_Lane("checkmate copies to host"), _Lane("checkmate copies to device")))
        return _lanes_made[0]


def _streams(device: torch.device) -> _Streams:
    """The CUDA device's two copy streams, made on first use."""
    with _making:
        if device not in _streams_made:
            _streams_made[device] = _Streams(torch.cuda.Stream(device), torch.cuda.Stream(device))
        return _streams_made[device]
