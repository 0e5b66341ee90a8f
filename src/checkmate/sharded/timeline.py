"""When a sharded step gathers, frees and reduces each FSDP2 unit, placed among the steps of the plan's schedule.

The schedule is the plan's, made for the unsharded step; this module adds what FSDP2 adds around it, as eager FSDP2
does around the forward and backward of each unit, at the places the schedule allows:

* gather: before the first step that reads a unit's parameters, the unit's all-gather (its full parameters become
  live). A step reads a parameter when one of its operations takes the parameter, or a view of it, as an argument.
* free: with `reshard_after_forward`, right after the last step of the forward stages (up to the loss's stage) that
  reads the unit's parameters; and the unit is gathered again before the first step of the backward stages that
  reads them (a recomputed forward node or a backward node). Without it (the root), the parameters stay gathered.
* reduce: right after the unit's last step, the later of the last step that reads its parameters and the last that
  makes one of its gradients: FSDP2's post-backward, which reduce-scatters the unit's gradients into the sharded
  `.grad`s (or keeps them, with `set_requires_gradient_sync(False)`) and frees the gathered parameters.

* prefetch (with `UnitUse.prefetch_gathers`): a gather is started early, and the all-gather runs on the process
  group's thread while the steps between compute; the GATHER at its place only waits for it. With the plan's
  presence, a gather whose run of present stages starts in stage s > 0 starts at the start of stage s - 1, where the
  plan counts its buffer (`checkmate.fetched`): how far ahead and in which order units are prefetched is the plan's.
  Without it, as FSDP2's implicit prefetching starts the next unit's all-gather: right after the gather before it,
  or after the unit's own last free or reduce if that comes later.

Gathers come before the step they serve, frees and reduces after theirs; at one place, in unit order, the frees
before the reduces. Every rank runs
the same schedule (rank 0's plan, `checkmate.sharded.agreement`), so every rank issues the same collectives in the
same order. A REDUCE runs FSDP2's post-backward, which issues the reduce-scatter on FSDP2's reduce-scatter stream
(CUDA: the steps after it overlap it; CPU: it is synchronous, as in eager FSDP2).

Which units are freed after their forward and gathered again is the plan's decision: the presence of each unit's
parameters, a fetched value of the plan's graph (`checkmate.fetched`; `checkmate.sharded.planning`), whose runs of
stages each get one gather, at the start of the run (where the plan counts the gather's buffers), and one free after
the run's last read. Without a presence, FSDP2's own rule: `UnitUse.reshard_after_forward`.
"""

from __future__ import annotations

import enum
import itertools
import logging
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from checkmate.execute.codegen import ScheduleItem
from checkmate.simulate import Compute

log = logging.getLogger(__name__)


class UnitAction(enum.Enum):
    """What a unit call does (see the module doc)."""

    GATHER = "gather"
    FREE = "free"
    REDUCE = "reduce"
    PREFETCH = "prefetch"


GATHER, FREE, REDUCE, PREFETCH = UnitAction.GATHER, UnitAction.FREE, UnitAction.REDUCE, UnitAction.PREFETCH


@dataclass(frozen=True)
class UnitCall:
    """One action on one unit at its place in the schedule: GATHER, FREE, REDUCE or PREFETCH (a GATHER's
    all-gather started early; the GATHER then waits for it)."""

    action: UnitAction
    unit: int


@dataclass(frozen=True)
class UnitUse:
    """What the schedule does with the units' parameters, per graph node.

    Attributes:
        reads: per graph node, the units whose parameters (or views of them) the node's operations read.
        gradients: per graph node, the units whose gradients the node makes (on its first computation).
        last_forward_stage: the stage of the node that makes the loss: stages after it are the backward.
        reshard_after_forward: per unit, whether FSDP2 frees its parameters after its forward.
        prefetch_gathers: whether each gather but the first is started early (PREFETCH).
    """

    reads: tuple[frozenset[int], ...]
    gradients: tuple[frozenset[int], ...]
    last_forward_stage: int
    reshard_after_forward: tuple[bool, ...]
    prefetch_gathers: bool = False


@dataclass(frozen=True)
class UnitPositions:
    """Where the units are used among a schedule's steps (positions in its step sequence).

    Attributes:
        forward_reads: per unit, the compute steps of the forward stages (up to the loss's) that read its parameters.
        backward_reads: per unit, those of the backward stages.
        last: per unit, its last step: the later of its last read and the last step that makes one of its gradients.
    """

    forward_reads: dict[int, list[int]]
    backward_reads: dict[int, list[int]]
    last: dict[int, int]


def unit_positions(steps: Sequence[ScheduleItem], use: UnitUse) -> UnitPositions:
    """Where `steps` read each unit's parameters and where each unit's last step is."""
    forward_reads: dict[int, list[int]] = {}
    backward_reads: dict[int, list[int]] = {}
    last: dict[int, int] = {}
    for position, step in enumerate(steps):
        if not isinstance(step, Compute):
            continue
        reads = forward_reads if step.stage <= use.last_forward_stage else backward_reads
        for unit in use.reads[step.node]:
            reads.setdefault(unit, []).append(position)
            last[unit] = position
        if step.stage == step.node:
            for unit in use.gradients[step.node]:
                last[unit] = position
    return UnitPositions(forward_reads, backward_reads, last)


def place_unit_calls(
    steps: Sequence[ScheduleItem], use: UnitUse, presence: np.ndarray | None = None
) -> tuple[ScheduleItem, ...]:
    """The schedule's steps with each unit's gathers, frees and reduce placed among them (see the module doc):
    FSDP2's placement, or, given the plan's `presence` (bool[T, units], `checkmate.fetched`), one gather per run of
    stages where a unit is present and read, before the first compute step of the run's first stage (after the frees
    of the stage before: where the plan counts the gather), and a free after its last read there, but the last
    run's, which the unit's REDUCE ends; with `UnitUse.prefetch_gathers`, each such gather of a run
    that starts in stage s > 0 is started at the start of stage s - 1 (PREFETCH), where the plan counts its
    buffer."""
    positions = unit_positions(steps, use)
    before: dict[int, list[UnitCall]] = {}
    after: dict[int, list[UnitCall]] = {}
    starts: dict[int, list[UnitCall]] = {}  # PREFETCHes, placed after the gathers at the same place
    stage_start = _stage_starts(steps)
    for unit in sorted(positions.last):
        forward, backward = positions.forward_reads.get(unit, []), positions.backward_reads.get(unit, [])
        if presence is not None:
            for run, reads in _reads_by_run(steps, [*forward, *backward], presence[:, unit]):
                if reads:  # at the run's start, where the plan counts the gather (`checkmate.fetched`)
                    before.setdefault(stage_start[run.first], []).append(UnitCall(GATHER, unit))
                    if use.prefetch_gathers and run.first > 0:
                        starts.setdefault(stage_start[run.first - 1], []).append(UnitCall(PREFETCH, unit))
                    if not run.final:
                        after.setdefault(reads[-1], []).append(UnitCall(FREE, unit))
        elif use.reshard_after_forward[unit] and forward:
            before.setdefault(forward[0], []).append(UnitCall(GATHER, unit))
            after.setdefault(forward[-1], []).append(UnitCall(FREE, unit))
            if backward:
                before.setdefault(backward[0], []).append(UnitCall(GATHER, unit))
        elif forward or backward:
            before.setdefault((forward or backward)[0], []).append(UnitCall(GATHER, unit))
        after.setdefault(positions.last[unit], []).append(UnitCall(REDUCE, unit))
    placed: list[ScheduleItem] = []
    for position, step in enumerate(steps):
        placed += before.get(position, [])
        placed += starts.get(position, [])
        placed.append(step)
        # frees first: at a reduce, no unit the next stage does not hold is still gathered (`checkmate.sharded.memory`)
        following: list[UnitCall] = sorted(after.get(position, []), key=_free_first)
        placed += following
    return _with_prefetches(placed) if use.prefetch_gathers and presence is None else tuple(placed)


def _free_first(call: UnitCall) -> bool:
    return call.action != FREE


def _stage_starts(steps: Sequence[ScheduleItem]) -> dict[int, int]:
    """Per stage, the position of its first compute step."""
    starts: dict[int, int] = {}
    for position, step in enumerate(steps):
        if isinstance(step, Compute):
            starts.setdefault(step.stage, position)
    return starts


@dataclass(frozen=True)
class _Run:
    """Stages first..last where a unit is present; `final`: the last such run."""

    first: int
    last: int
    final: bool


def _reads_by_run(
    steps: Sequence[ScheduleItem], reads: Sequence[int], present: np.ndarray
) -> list[tuple[_Run, list[int]]]:
    """Each run of stages where `present`, with the positions among `reads` whose step runs in it.

    Raises:
        ValueError: a read runs in a stage where the unit is not present (the plan's presence does not cover it).
    """
    stages = np.flatnonzero(present)
    breaks = np.flatnonzero(np.diff(stages) > 1)
    firsts = [int(stage) for stage in np.concatenate([stages[:1], stages[breaks + 1]])]
    lasts = [int(stage) for stage in np.concatenate([stages[breaks], stages[-1:]])]
    runs = [
        _Run(first, last, index == len(firsts) - 1)
        for index, (first, last) in enumerate(zip(firsts, lasts, strict=True))
    ]
    grouped: list[tuple[_Run, list[int]]] = [(run, []) for run in runs]
    for position in sorted(reads):
        step = steps[position]
        assert isinstance(step, Compute)
        inside = [group for run, group in grouped if run.first <= step.stage <= run.last]
        if not inside:
            raise ValueError(f"a step of stage {step.stage} reads a unit the plan does not hold there")
        inside[0].append(position)
    return grouped


def _with_prefetches(placed: Sequence[ScheduleItem]) -> tuple[ScheduleItem, ...]:
    """`placed` with a PREFETCH of each GATHER's unit but the first's, right after the GATHER before it or after the
    unit's own last FREE or REDUCE before it, whichever is later."""
    calls = [(position, step) for position, step in enumerate(placed) if isinstance(step, UnitCall)]
    gathers = [(position, call) for position, call in calls if call.action == GATHER]
    starts: dict[int, list[UnitCall]] = {}
    for (previous, _), (current, gather) in itertools.pairwise(gathers):
        released = [
            position
            for position, call in calls
            if previous < position < current and call.unit == gather.unit and call.action in (FREE, REDUCE)
        ]
        starts.setdefault(max([previous, *released]), []).append(UnitCall(PREFETCH, gather.unit))
    with_prefetches: list[ScheduleItem] = []
    for position, step in enumerate(placed):
        with_prefetches.append(step)
        with_prefetches += starts.get(position, [])
    return tuple(with_prefetches)
