"""Passes over a lowered schedule: what runs around and instead of the plan's steps, composed in a stated order.

A schedule (`checkmate.simulate.lower`) is a sequence of Compute and Free steps. Before its step function is
generated (`checkmate.execute.program.Program.step_function`), the passes of the step rewrite it, by `PassOrder`:

1. PLACE: a distribution places its calls among the steps (FSDP2's gathers, frees, prefetches and reduce-scatters:
   `checkmate.sharded.unit_calls`) and says what they hold beside the plan's own accounting at each compute step
   (`Lowering.held`), and the peak the step is planned to reach with them (`Lowering.peak`).
2. FUSE: an executor replaces runs of Compute and Free steps by compiled calls (`checkmate.inductor.segments`). A
   run never crosses a placed call, and what a fused call holds stays within `Lowering.peak` less `Lowering.held`.

Passes of one order apply in the order given. A pass may insert steps and replace runs of Compute and Free steps;
it never reorders them, so the schedule's steps keep their order among the others (`schedule_positions`).

DDP's gradient buckets are not a pass: a bucket is complete when its last gradient is made, wherever the executor
makes it, so the distribution's gradient sink starts its all-reduce (`checkmate.data_parallel.reducer`).
"""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from checkmate.execute.codegen import ScheduleItem
from checkmate.simulate import Compute, Free, Schedule


class PassOrder(enum.IntEnum):
    """When a pass runs: distributions place their calls first, executors fuse what lies between them."""

    PLACE = 10
    FUSE = 20


@dataclass(frozen=True)
class Lowering:
    """A schedule on its way to a step function.

    Attributes:
        schedule: the plan's schedule, as lowered.
        steps: its steps as the passes so far left them.
        held: per Compute step of `schedule`, in order, the bytes held beside the plan's own accounting at that
            moment (a distribution's gathered parameters, say); zeros in a single-process step.
        peak: the most bytes the step is planned to hold at any moment, `held` included.
    """

    schedule: Schedule
    steps: tuple[ScheduleItem, ...]
    held: tuple[int, ...]
    peak: int


class SchedulePass(Protocol):
    """A rewrite of a lowered schedule; `order` says when it runs among the others."""

    @property
    def order(self) -> PassOrder: ...

    def __call__(self, lowering: Lowering) -> Lowering: ...


def start(schedule: Schedule) -> Lowering:
    """The lowering of `schedule` before any pass: its own steps, nothing held beside them, its own peak."""
    return Lowering(schedule, schedule.steps, (0,) * len(schedule.usage), schedule.peak_memory)


def apply_passes(schedule: Schedule, passes: Sequence[SchedulePass]) -> tuple[ScheduleItem, ...]:
    """The steps the step function runs for `schedule`: `passes` applied by their order."""
    lowering = start(schedule)
    for schedule_pass in sorted(passes, key=lambda each: each.order):
        lowering = schedule_pass(lowering)
    return lowering.steps


def schedule_positions(steps: Sequence[ScheduleItem]) -> tuple[int | None, ...]:
    """For each item of `steps`, its position in the schedule's own steps when it is a Compute or Free step, else
    None (an item a pass added)."""
    positions: list[int | None] = []
    position = 0
    for step in steps:
        if isinstance(step, Compute | Free):
            positions.append(position)
            position += 1
        else:
            positions.append(None)
    return tuple(positions)


def with_steps(lowering: Lowering, steps: Sequence[ScheduleItem]) -> Lowering:
    """`lowering` with its steps replaced."""
    return dataclasses.replace(lowering, steps=tuple(steps))
