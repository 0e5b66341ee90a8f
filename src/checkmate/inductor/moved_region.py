"""A `torch.compile` region's moves to host memory as steps of the forward and backward graphs AOTAutograd runs
(`checkmate.backend(..., host_budget=...)`).

The copies are placed among the schedule's steps as the executors place them (`checkmate.execute.host_copies.
placed_copies`), and each becomes a call in the graph of its stage (`checkmate.inductor.split.GraphStep`):

* `copy_out(node, kept, *values)` right after the node's computation (or where a held value's copy starts) starts
  copying its values to host memory and returns a ticket (below);
* `end_copy_out(ticket, *values)` where the plan frees the node: it waits for the copy, and reading the values keeps
  them alive until there, as the plan counts them;
* `copy_in(ticket)` where the copy back's buffer starts: allocates the device storages and starts the copy; its
  ticket names the copy back;
* `end_copy_in(node, last, ticket)` at the start of the stage that reads the node: waits, and returns the values,
  rebuilt bit for bit on the new storages, which the graph then reads as a computed node's.

A ticket is a one-element int64 tensor over numpy memory, outside every allocator the device meters read, so a copy
that crosses from the forward to the backward is saved by AOTAutograd as a ticket, not as the device value: the
forward ends without the value, as the plan says. Each copy's state lives as long as its ticket's memory, so two
forwards before one backward keep two copies, and a forward whose backward never runs lets go of its copy with its
autograd graph. A node's host copies return to the region's pool at its last copy back of a step and are reused by
the next step's copy out.
"""

from __future__ import annotations

import itertools
import weakref
from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from checkmate.execute.host_copies import (
    CopyStep,
    EndCopyIn,
    EndCopyOut,
    Inbound,
    Outbound,
    StartCopyIn,
    StartCopyOut,
    finish_copy_in,
    placed_copies,
    start_copy_in,
    start_copy_out,
    wait_for,
)
from checkmate.inductor.kernels import NodeKernel
from checkmate.inductor.split import GraphBuilder, GraphStep, named
from checkmate.simulate import Compute, Free, Schedule

TICKET_OUT = "host_copy_{}_{}"
TICKET_IN = "copy_back_{}_{}"


class RegionCopier:
    """Runs one region's copies; each copy in flight is named by a ticket (module doc)."""

    def __init__(self) -> None:
        self._copies: dict[int, Outbound | Inbound] = {}
        self._pool: defaultdict[int, list[list[torch.Tensor]]] = defaultdict(list)
        self._numbers = itertools.count()

    def copy_out(self, node: int, kept: tuple[bool, ...], *values: Any) -> torch.Tensor:
        """Start copying node `node`'s values to host memory (those `kept`, which leave the region, come back as they
        are) into a pooled host copy where there is one; the copy's ticket."""
        pool = self._pool[node]
        return self._ticket(start_copy_out(values, kept, pool.pop() if pool else None))

    def end_copy_out(self, ticket: torch.Tensor, *values: Any) -> None:
        """Wait until the copy out `ticket` is complete; the device values may be freed after this call."""
        outbound = self._outbound(ticket)
        wait_for(outbound.pending, outbound.device)

    def copy_in(self, ticket: torch.Tensor) -> torch.Tensor:
        """Allocate the device storages of the copy out `ticket` and start copying them back; the copy back's
        ticket."""
        return self._ticket(start_copy_in(self._outbound(ticket)))

    def end_copy_in(self, node: int, last: bool, ticket: torch.Tensor) -> tuple[Any, ...]:
        """Wait for the copy back `ticket`, and return node `node`'s values on their new storages; the `last` copy
        back of the step returns the host copy to the pool."""
        inbound = self._copies[int(ticket.item())]
        assert isinstance(inbound, Inbound)
        values = finish_copy_in(inbound)
        if last:
            self._pool[node].append(inbound.outbound.hosts)
        return values

    @property
    def in_flight(self) -> int:
        """Copies whose tickets are alive."""
        return len(self._copies)

    @property
    def pooled_bytes(self) -> int:
        """Bytes of the host copies in the pool (after a step: all of them)."""
        return sum(host.numel() for hosts in self._pool.values() for copy in hosts for host in copy)

    def _ticket(self, copy: Outbound | Inbound) -> torch.Tensor:
        number = next(self._numbers)
        memory = np.array([number], dtype=np.int64)
        self._copies[number] = copy
        weakref.finalize(memory, self._copies.pop, number, None)
        return torch.from_numpy(memory)

    def _outbound(self, ticket: torch.Tensor) -> Outbound:
        outbound = self._copies[int(ticket.item())]
        assert isinstance(outbound, Outbound)
        return outbound


def region_steps(
    schedule: Schedule, kernels: Sequence[NodeKernel], leaving: frozenset[str], copier: RegionCopier
) -> tuple[Compute | GraphStep, ...]:
    """The schedule's computations with its copies to host memory and back among them, as steps of the region's
    graphs; the values in `leaving` (those that leave the region) are not copied."""
    moves = schedule.moves
    if not moves.any:
        return tuple(step for step in schedule.steps if isinstance(step, Compute))
    T = moves.copy_out.shape[0]
    placed = placed_copies(schedule.steps, moves.copy_out, moves.copy_in, moves.buffers(T), copier)
    stages = _stages(placed)
    copied_out: dict[int, int] = {}
    steps: list[Compute | GraphStep] = []
    for item, stage in zip(placed, stages, strict=True):
        if isinstance(item, Compute):
            steps.append(item)
            continue
        if not isinstance(item, CopyStep):
            continue  # a free: fx frees each value after its last reader
        node, names = item.node, kernels[item.node].outputs
        if isinstance(item, StartCopyOut):
            kept = tuple(name in leaving for name in names)
            copy_out = named(copier.copy_out, f"copy_out_{node}")
            steps.append(
                _CopyCall(item.stage, copy_out, (node, kept), names, ticket=TICKET_OUT.format(node, item.stage))
            )
            copied_out[node] = item.stage
        elif isinstance(item, EndCopyOut):
            ticket = TICKET_OUT.format(node, item.stage)
            steps.append(_CopyCall(stage, named(copier.end_copy_out, f"end_copy_out_{node}"), (), (ticket, *names)))
        elif isinstance(item, StartCopyIn):
            ticket = TICKET_OUT.format(node, copied_out[node])
            copy_in = named(copier.copy_in, f"copy_in_{node}")
            steps.append(_CopyCall(stage, copy_in, (), (ticket,), ticket=TICKET_IN.format(node, item.stage)))
        elif isinstance(item, EndCopyIn):
            end_copy_in = named(copier.end_copy_in, f"end_copy_in_{node}")
            ticket = TICKET_IN.format(node, item.stage)
            steps.append(_CopyCall(stage, end_copy_in, (node, bool(item.last)), (ticket,), unpacked=names))
    return tuple(steps)


def _stages(placed: Sequence[object]) -> list[int]:
    """The stage whose graph runs each placed step: a computation's, a free's and a copy out's own; any other copy's
    is that of the computation or free it is placed before (a stage's start, or the free a copy out ends at)."""
    stages: list[int] = []
    following = -1
    for item in reversed(placed):
        if isinstance(item, Compute | Free):
            following = item.stage
        stages.append(item.stage if isinstance(item, Compute | Free | StartCopyOut) else following)
    stages.reverse()
    last = max((item.stage for item in placed if isinstance(item, Compute | Free)), default=0)
    return [last if stage < 0 else stage for stage in stages]


@dataclass(frozen=True)
class _CopyCall:
    """One call of the region's copier in the graph of `stage`: `function` on the `constants`, then the values
    `reads`; it returns the `ticket` of the copy it starts, or the values `unpacked` of the copy back it ends, or
    nothing."""

    stage: int
    function: Callable[..., Any] = field(compare=False, repr=False)
    constants: tuple[Any, ...]
    reads: tuple[str, ...]
    ticket: str | None = None
    unpacked: tuple[str, ...] = ()

    @property
    def makes(self) -> tuple[str, ...]:
        return self.unpacked if self.ticket is None else (self.ticket,)

    def emit(self, builder: GraphBuilder) -> None:
        if self.ticket is not None:
            with builder.fake_mode:
                builder.meta[self.ticket] = torch.empty(1, dtype=torch.int64)
        call = builder.call(self.function, [*self.constants, *(builder.read(name) for name in self.reads)], self.ticket)
        builder.unpack(call, self.unpacked)
