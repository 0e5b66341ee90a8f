"""What a sharded step holds at each moment: the plan's own accounting plus what FSDP2's units hold around it.

The plan is made on the unsharded step's graph, whose fixed memory holds only this rank's shards. A sharded step
also holds, at the places `checkmate.sharded.timeline` puts each unit's calls:

* the gathered parameters of every unit between its GATHER and its FREE or its REDUCE (FSDP2's post-backward
  frees them, `reshard_after_backward`): `UnitBytes.parameters`, each parameter padded as FSDP2 pads it, times the
  world size. While a gather runs, FSDP2's flat all-gather buffer is alive beside the per-parameter outputs it is
  copied into: twice those bytes. A prefetched gather holds the flat buffer from its PREFETCH to its GATHER, where the
  per-parameter outputs are made and the flat buffer let go.
* the unsharded gradients of every unit from the op that first makes each (`UnitBytes.made`, per graph node) to the
  unit's REDUCE; when the step starts with no `.grad`s (`gradient_memory="when_made"`), the gradient shards each
  REDUCE makes, from it to the end of the step (otherwise they are in the fixed memory).
* while a unit reduces, its reduce-scatter input (the padded unsharded gradients, `UnitBytes.gradients`) and output
  (this rank's shard) beside its unsharded gradients; FSDP2 then keeps that input alive until the next unit reduces
  (`comm_ctx.reduce_scatter_state`), so one such buffer is counted from each REDUCE to the next, and the last one of
  the step before from the start of the step to its first REDUCE.
* with a process group whose collectives copy their buffers (gloo, on CPU: a flat copy of the full buffer and one of
  this rank's shard per all-gather and per reduce-scatter), those copies during each unit call; a prefetched
  all-gather's from its PREFETCH to its GATHER.

What a gloo worker thread holds of a collective after it completes is not counted: the thread drops it as soon as
the run returns (`ProcessGroupGloo::runLoop`), which the allocator meter, counting every thread's frees, shows within
the over-counts below (the step's per-rank peak steady from call to call, at or below this count; BENCHMARKS.md,
"Noticed").

When the plan decides where each unit's parameters are present (its graph's fetched values, `checkmate.fetched`),
the units' calls follow that presence (`checkmate.sharded.timeline.place_unit_calls`), and the moments here take
the present parameters out of the simulator's usage, to count them at the calls instead. The plan counts each
gather's buffers too, as its fetch's workspaces (`gather_workspaces`): through the stage of a GATHER, the flat buffer
and gloo's copies beside the gathered parameters; through the stage of a PREFETCH, gloo's copies beside the flat
buffer. Those are taken out of the simulator's usage as well (`Schedule.fetched_bytes`), so the plan's usage and
these moments count every gather where the plan puts it.

`sharded_usage` adds these to the simulator's usage after each compute step (`Schedule.usage`, which includes the
fixed memory; the gradients a node makes count in its workspace at its own moment, from the first op to make one to
its end, so they are added from the next moment on) and counts the moments of the unit calls themselves: a call that
only other unit calls separate from a stage's first compute step (every free of the stage before has run) on top of
the usage at that stage's start (`Schedule.stage_start`), in that stage; every other call on top of the usage of the
compute step before it (its workspace included: an over-count, never an under-count). Its largest
value is the per-rank peak a sharded step's plan predicts (`sharded_peak`).
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np

from checkmate.execute.codegen import ScheduleItem
from checkmate.sharded.timeline import FREE, GATHER, PREFETCH, REDUCE, UnitCall, UnitUse, place_unit_calls
from checkmate.simulate import Compute, Schedule

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class UnitBytes:
    """Sizes of what the units hold on one rank.

    Attributes:
        parameters: per unit, bytes of its gathered parameters (padded, all ranks' shards).
        gradients: per unit, bytes of its padded unsharded gradients: its reduce-scatter input.
        parameter_shards: per unit, bytes of this rank's shard of its parameters: its all-gather input.
        gradient_shards: per unit, bytes of this rank's shard of its gradients: its reduce-scatter output.
        made: per graph node, {unit: bytes} of the unsharded gradients its first run makes.
        fixed_memory: the graph's fixed memory: what is held before the first compute step.
        collectives_copy: whether the process group's collectives copy their buffers (gloo).
        shards_made_at_reduce: whether each REDUCE makes its unit's gradient shards, held from there on (the step
            starts with no `.grad`s); otherwise the fixed memory holds them for the whole step.
    """

    parameters: tuple[int, ...]
    gradients: tuple[int, ...]
    parameter_shards: tuple[int, ...]
    gradient_shards: tuple[int, ...]
    made: tuple[dict[int, int], ...]
    fixed_memory: int
    collectives_copy: bool
    shards_made_at_reduce: bool


class Moment(NamedTuple):
    """One moment of the sharded step: after a compute step, or during a unit call."""

    stage: int
    graph: int  # the graph's own usage (`Schedule.usage`), less what the plan counts for the units' gathers
    units: int  # what the units hold beside it
    compute: bool  # after a compute step (else during a unit call)


def sharded_usage(schedule: Schedule, use: UnitUse, sizes: UnitBytes) -> tuple[int, ...]:
    """Bytes in use at each moment of the sharded step: after each compute step and during each unit call."""
    return tuple(moment.graph + moment.units for moment in _moments(schedule, use, sizes))


def held_at_computes(schedule: Schedule, use: UnitUse, sizes: UnitBytes) -> tuple[int, ...]:
    """What the units hold beside the graph's usage (`Schedule.usage`) at each compute step of `schedule`, in order:
    less than nothing where the plan's presence counts parameters in that usage that are not gathered yet."""
    _, present = _planned_presence(schedule, sizes)
    moments = _moments(schedule, use, sizes)
    return tuple(moment.units - int(present[moment.stage]) for moment in moments if moment.compute)


@dataclass(frozen=True)
class StageMemory:
    """A sharded step's memory per stage (a unit call belongs to the stage of the compute step before it, or of the
    first one).

    Attributes:
        extras: per stage, the most the units hold beside the graph's own usage at any moment of it, less what the
            plan counts for the gathers in that usage (`Schedule.fetched_bytes`; never below 0): the
            `Graph.stage_held` that lets a solver see the units, estimated on the schedule.
        peaks: per stage, the most bytes in use at any moment of it (`sharded_usage`).
        counted: per stage, what a solver given `extras` counts there for this schedule: the graph's largest usage
            at a compute step of it plus its extra (at least its peak: one extra per stage can count a call's or a
            compute step's bytes beside another compute step's usage).
    """

    extras: tuple[int, ...]
    peaks: tuple[int, ...]
    counted: tuple[int, ...]

    @property
    def peak(self) -> int:
        """The per-rank peak of the sharded step (`sharded_peak`)."""
        return max(self.peaks)

    @property
    def counted_peak(self) -> int:
        """The largest of `counted`: the peak a solver counts for this schedule."""
        return max(self.counted)


def stage_memory(schedule: Schedule, use: UnitUse, sizes: UnitBytes) -> StageMemory:
    """The extras and peaks of each stage, from one replay of the sharded step."""
    stages = max((step.stage for step in schedule.steps), default=-1) + 1
    extras, peaks, computed = [0] * stages, [0] * stages, [0] * stages
    _, present = _planned_presence(schedule, sizes)
    moments = list(_moments(schedule, use, sizes))
    for moment in moments:
        if moment.compute:
            computed[moment.stage] = max(computed[moment.stage], moment.graph)
    for stage, graph_part, units, compute in moments:
        # A solver adds a stage's extra to each of its compute steps: at a unit call between them, what the call holds
        # beside the graph need only reach the stage's largest graph usage at a compute step.
        beside = units if compute else graph_part + units - computed[stage]
        extras[stage] = max(extras[stage], beside - int(present[stage]))
        peaks[stage] = max(peaks[stage], graph_part + units)
    counted = [max(computed[stage] + int(present[stage]) + extras[stage], peaks[stage]) for stage in range(stages)]
    return StageMemory(tuple(extras), tuple(peaks), tuple(counted))


def _moments(schedule: Schedule, use: UnitUse, sizes: UnitBytes) -> Iterator[Moment]:
    """Each moment of the sharded step, in order."""
    gathered = [False] * len(sizes.parameters)
    in_flight = [False] * len(sizes.parameters)  # prefetched: the flat all-gather buffer, not yet copied out
    unsharded = [0] * len(sizes.parameters)
    presence, present = _planned_presence(schedule, sizes)
    steps = place_unit_calls(schedule.steps, use, presence)
    reduces = [step.unit for step in steps if isinstance(step, UnitCall) and step.action == REDUCE]
    reduce_buffer = sizes.gradients[reduces[-1]] if reduces else 0  # kept from the step before
    pending_copies: dict[int, int] = {}  # unit: the copies of its all-gather in flight (prefetched)
    made_shards = 0
    before = sizes.fixed_memory
    stage = next((step.stage for step in schedule.steps if isinstance(step, Compute)), 0)
    computes = iter(schedule.usage)

    def held() -> int:
        live = [was or pending for was, pending in zip(gathered, in_flight, strict=True)]
        parameters = sum(size for size, alive in zip(sizes.parameters, live, strict=True) if alive)
        return parameters + sum(unsharded) + reduce_buffer + made_shards + sum(pending_copies.values())

    opening = _opening_stages(steps) if schedule.stage_start else [None] * len(steps)
    for step, opens in zip(steps, opening, strict=True):
        if isinstance(step, Compute):
            before, stage = next(computes) - int(present[step.stage]), step.stage
            yield Moment(stage, before, held(), True)  # its gradients are in its workspace now
            if step.stage == step.node:
                for unit, size in sizes.made[step.node].items():
                    unsharded[unit] += size
        elif isinstance(step, UnitCall):
            prefetched = in_flight[step.unit]
            copy = 0 if prefetched else _copies(step, sizes)  # a prefetched all-gather ran at its PREFETCH
            transient = sizes.parameters[step.unit] if prefetched else _transient(step, sizes)
            during = held() + transient + copy
            if opens is None:
                yield Moment(stage, before, during, False)
            else:  # between stages, after the frees of the stage before
                yield Moment(opens, schedule.stage_start[opens] - int(present[opens]), during, False)
            if step.action == PREFETCH:  # its copies are held until its GATHER waits for it
                in_flight[step.unit], pending_copies[step.unit] = True, copy
            else:
                pending_copies.pop(step.unit, None)
            if step.action == GATHER:
                gathered[step.unit], in_flight[step.unit] = True, False
            elif step.action == FREE:
                gathered[step.unit] = False
            elif step.action == REDUCE:  # FSDP2's post-backward also frees the gathered parameters
                gathered[step.unit] = False
                unsharded[step.unit] = 0
                reduce_buffer = sizes.gradients[step.unit]
                if sizes.shards_made_at_reduce:
                    made_shards += sizes.gradient_shards[step.unit]


def _opening_stages(steps: Sequence[ScheduleItem]) -> list[int | None]:
    """Per step, for a unit call that only other unit calls separate from the first compute step of a stage (so
    every free of the stage before has run): that stage; None for every other step."""
    last_stage: list[int] = []
    stage = -1
    for step in steps:
        last_stage.append(stage)
        if isinstance(step, Compute):
            stage = step.stage
    opening: list[int | None] = [None] * len(steps)
    upcoming: int | None = None  # the stage of the next compute step, while only unit calls come before it
    for position in range(len(steps) - 1, -1, -1):
        step = steps[position]
        if isinstance(step, Compute):
            upcoming = step.stage
        elif not isinstance(step, UnitCall):
            upcoming = None
        elif upcoming is not None and upcoming != last_stage[position]:
            opening[position] = upcoming
    return opening


def _planned_presence(schedule: Schedule, sizes: UnitBytes) -> tuple[np.ndarray | None, np.ndarray]:
    """The plan's presence of the units' parameters (None: FSDP2's placement) and the bytes the plan counts for them
    in each stage (`Schedule.fetched_bytes`: the parameters present or prefetched for the next stage and their
    gathers' workspaces, `gather_workspaces`), which the moments count at the units' calls instead."""
    stages = (
        len(schedule.presence)
        if schedule.presence.size
        else 1 + max((step.stage for step in schedule.steps), default=0)
    )
    if schedule.presence.shape[1:] != (len(sizes.parameters),):
        return None, np.zeros(stages, dtype=np.int64)
    return schedule.presence, np.array(schedule.fetched_bytes, dtype=np.int64)


def gather_workspaces(sizes: UnitBytes) -> tuple[np.ndarray, np.ndarray]:
    """int64[units] each: what a unit's gather holds beside its gathered parameters through the stage of its GATHER
    (the flat all-gather buffer, copied out into the parameters there, and gloo's copies) and, prefetched, beside the
    flat buffer through the stage of its PREFETCH (gloo's copies): the fetch workspaces of the plan's fetched
    values (`checkmate.fetched`)."""
    copies = np.array([_copies(UnitCall(GATHER, unit), sizes) for unit in range(len(sizes.parameters))], dtype=np.int64)
    return np.array(sizes.parameters, dtype=np.int64) + copies, copies


def sharded_peak(schedule: Schedule, use: UnitUse, sizes: UnitBytes) -> int:
    """The largest of `sharded_usage`: the per-rank peak of the sharded step."""
    return max(sharded_usage(schedule, use, sizes), default=sizes.fixed_memory)


def _copies(call: UnitCall, sizes: UnitBytes) -> int:
    if not sizes.collectives_copy:
        return 0
    if call.action in (GATHER, PREFETCH):
        return sizes.parameters[call.unit] + sizes.parameter_shards[call.unit]
    if call.action == REDUCE:
        return sizes.gradients[call.unit] + sizes.gradient_shards[call.unit]
    return 0


def _transient(call: UnitCall, sizes: UnitBytes) -> int:
    if call.action == GATHER:
        return 2 * sizes.parameters[call.unit]
    if call.action == PREFETCH:  # the flat buffer, held from here on (`in_flight`)
        return sizes.parameters[call.unit]
    if call.action == REDUCE:
        return sizes.gradients[call.unit] + sizes.gradient_shards[call.unit]
    return 0
