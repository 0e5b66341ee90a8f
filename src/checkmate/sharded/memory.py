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
gather's buffers too, as its fetch's workspaces (`gather_workspaces`): at the start of the stage of a GATHER, where
it runs, the flat buffer and gloo's copies beside the gathered parameters (`Schedule.openings`); through the stage of
a PREFETCH, gloo's copies beside the flat buffer. The prefetches' are taken out of the simulator's usage as well
(`Schedule.fetched_bytes`), so the plan's usage and these moments count every gather where the plan puts it.

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
    opening: bool  # a unit call counted on the usage at its stage's start (`_opening_stages`)
    after_own_run: int  # for a unit call that only unit calls separate from a node's run in its own stage: that node
    unplanned: int  # of `units`, what no plan counts: gradients, reduce-scatter buffers, a reducing unit's parameters


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
        peaks: per stage, the most bytes in use at any moment of it (`sharded_usage`).
    """

    peaks: tuple[int, ...]

    @property
    def peak(self) -> int:
        """The per-rank peak of the sharded step (`sharded_peak`)."""
        return max(self.peaks)


def stage_memory(schedule: Schedule, use: UnitUse, sizes: UnitBytes) -> StageMemory:
    """The peak of each stage, from one replay of the sharded step."""
    peaks = [0] * _stage_count(schedule)
    for moment in _moments(schedule, use, sizes):
        peaks[moment.stage] = max(peaks[moment.stage], moment.graph + moment.units)
    return StageMemory(tuple(peaks))


@dataclass(frozen=True)
class SolverExtras:
    """What the units hold that no plan counts, as a solver sees it (`Graph.stage_held`, `Graph.opening_held`).

    A plan counts the units' gathered parameters and their gathers' buffers where its presence puts them (its fetched
    values, `Schedule.fetched_bytes`); what it does not count is the unsharded gradients, the reduce-scatter buffers,
    the gradient shards each REDUCE makes and, while a unit reduces between two stages, its own parameters (its
    presence ends at its last use). These change only at each unit's REDUCE, after its last gradient, and at the
    nodes that make gradients in their own stages, so they are the same for every plan whose REDUCEs are where the
    step without recomputation has them; counted this way, what the solver counts at each moment is what the sharded
    step holds there.

    Attributes:
        stage_held: per stage, the most they hold at a compute step or a unit call inside the stage, but the calls
            right after the run of the stage's own node.
        after_own_run: per node, what they hold beyond its stage's `stage_held` at the unit calls right after its
            run in its own stage (a REDUCE after its unit's last gradient), counted on the usage of that run, its
            workspace included: a solver counts it as more workspace of the node's first run.
        opening_held: per stage, what they hold beyond `stage_held` at a unit call between the stage before and this
            one's first compute step (a REDUCE where nothing is freed after it in the stage before), counted on the
            usage at the stage's start.
    """

    stage_held: tuple[int, ...]
    after_own_run: tuple[int, ...]
    opening_held: tuple[int, ...]

    def at_least(self, other: SolverExtras) -> SolverExtras:
        """The larger of the two in each stage."""
        return SolverExtras(
            tuple(map(max, self.stage_held, other.stage_held)),
            tuple(map(max, self.after_own_run, other.after_own_run)),
            tuple(map(max, self.opening_held, other.opening_held)),
        )


def solver_extras(schedule: Schedule, use: UnitUse, sizes: UnitBytes) -> SolverExtras:
    """The `SolverExtras` of `schedule`, from one replay of the sharded step."""
    stages = _stage_count(schedule)
    within, after_own_run, opening = [0] * stages, [0] * stages, [0] * stages
    moments = list(_moments(schedule, use, sizes))
    for moment in moments:
        if not moment.opening and moment.after_own_run < 0:
            within[moment.stage] = max(within[moment.stage], moment.unplanned)
    for moment in moments:
        if moment.opening:
            opening[moment.stage] = max(opening[moment.stage], moment.unplanned - within[moment.stage])
        elif moment.after_own_run >= 0:
            node = moment.after_own_run
            after_own_run[node] = max(after_own_run[node], moment.unplanned - within[moment.stage])
    return SolverExtras(tuple(within), tuple(after_own_run), tuple(opening))


def _stage_count(schedule: Schedule) -> int:
    return max((step.stage for step in schedule.steps), default=-1) + 1


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

    def gathers() -> int:
        live = [was or pending for was, pending in zip(gathered, in_flight, strict=True)]
        parameters = sum(size for size, alive in zip(sizes.parameters, live, strict=True) if alive)
        return parameters + sum(pending_copies.values())

    def gradients() -> int:
        return sum(unsharded) + reduce_buffer + made_shards

    def held() -> int:
        return gathers() + gradients()

    def unplanned() -> int:  # without the plan's presence, its gathers too
        return gradients() if presence is not None else held()

    opening = _opening_stages(steps) if schedule.stage_start else [None] * len(steps)
    own_run = -1  # the node whose run in its own stage only unit calls separate from the step
    for step, opens in zip(steps, opening, strict=True):
        if not isinstance(step, UnitCall):
            own_run = step.node if isinstance(step, Compute) and step.stage == step.node else -1
        if isinstance(step, Compute):
            before, stage = next(computes) - int(present[step.stage]), step.stage
            yield Moment(stage, before, held(), True, False, -1, unplanned())  # its gradients are in its workspace now
            if step.stage == step.node:
                for unit, size in sizes.made[step.node].items():
                    unsharded[unit] += size
        elif isinstance(step, UnitCall):
            prefetched = in_flight[step.unit]
            copy = 0 if prefetched else _copies(step, sizes)  # a prefetched all-gather ran at its PREFETCH
            transient = sizes.parameters[step.unit] if prefetched else _transient(step, sizes)
            during = held() + transient + copy
            outside = unplanned()
            if presence is None:
                outside += transient + copy
            elif step.action == REDUCE:  # and the unit's parameters where the plan no longer has them present
                counted = bool(presence[stage if opens is None else opens, step.unit])
                outside += (
                    transient + copy + (sizes.parameters[step.unit] if gathered[step.unit] and not counted else 0)
                )
            if opens is None:
                yield Moment(stage, before, during, False, False, own_run, outside)
            else:  # between stages, after the frees of the stage before
                start = schedule.stage_start[opens] - int(present[opens])
                yield Moment(opens, start, during, False, True, -1, outside)
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
    """int64[units] each: what a unit's gather holds beside its gathered parameters at the start of the stage of its
    GATHER (the flat all-gather buffer, copied out into the parameters there, and gloo's copies) and, prefetched,
    beside the flat buffer through the stage of its PREFETCH (gloo's copies): the fetch workspaces of the plan's
    fetched values (`checkmate.fetched`)."""
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
