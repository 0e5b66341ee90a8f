"""The time model of a link that moves values to and from the device beside compute: one for every value held
elsewhere.

Two kinds of value live off the device for part of a step and come back over a link: an activation a plan copies to
host memory and back (`checkmate.moved`, over the host link, one lane each way) and an FSDP2 unit's parameters,
sharded across the ranks, gathered for the stages that read them and released after their last use with a
reduce-scatter of their gradients (`checkmate.fetched`, over the process group, one lane). Each builds its copies
(`Copies`) from its own decisions and both are priced here, by one model:

* each copy has work (its cost in the graph's cost unit) and a window, the run of stages `first` to `last` in which
  it may run; it must be complete at the end of stage `last`;
* each stage lends each lane `lent[s]` of link time beside its compute (for the host link, its `overlap` x the
  stage's compute; the fetched values' stages are the slots between the step's stages, each lending what the
  compute it runs beside hides);
* a lane runs one copy at a time, earliest deadline first, using the time lent; where a copy due at stage s is not
  complete at its end, the step waits there: the stage's time grows by the longest of the lanes' waits, and every
  lane goes on copying while it waits (`LinkSchedule.exposed`).

The earliest deadline first, with the link kept busy, is an optimal schedule of such a fluid link: the wait at each
stage is the least any order of the copies within their windows allows, which is why the MILP's rows for the same
model (`checkmate.milp.moves`, and the exposed fetch rows of `checkmate.milp.formulation`) price a plan as this does.
"""

from __future__ import annotations

import dataclasses
import heapq
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class Copies:
    """One lane's copies, one entry each.

    Attributes:
        work: float64[n]; each copy's time on the link, in the graph's cost unit.
        first: int64[n]; the first stage of its window.
        last: int64[n]; the last stage of its window: it is complete at that stage's end.
        column: int64[n]; the value it moves (the column of `LinkSchedule.done` it counts in).
    """

    work: np.ndarray
    first: np.ndarray
    last: np.ndarray
    column: np.ndarray

    def __post_init__(self) -> None:
        sizes = {array.shape for array in (self.work, self.first, self.last, self.column)}
        if len(sizes) != 1 or len(next(iter(sizes))) != 1:
            raise ValueError(f"a lane's copies need four arrays of one length, got shapes {sorted(sizes)}")
        if (self.first > self.last).any() or (self.work < 0).any():
            raise ValueError("each copy needs a window of at least one stage (first <= last) and work >= 0")


@dataclass(frozen=True)
class LinkSchedule:
    """The link's work as the time model schedules it.

    Attributes:
        exposed: float64[T]; per stage, the time the step waits there for copies (added to its compute).
        done: per lane, float64[T, columns]: done[s, v], the part of the lane's copies of value v run in stage s.
    """

    exposed: np.ndarray
    done: tuple[np.ndarray, ...]


def schedule(lanes: Sequence[Copies], lent: np.ndarray, columns: int) -> LinkSchedule:
    """Run each lane's copies on the time `lent` (float64[T], >= 0) stage by stage, earliest deadline first, and
    wait where a copy is not done by the end of its window (module doc)."""
    if all((copies.first == copies.last).all() for copies in lanes):
        return _one_stage_windows(lanes, lent, columns)
    if len(lanes) == 1 and not lent.any():  # one lane lent nothing runs each copy in the wait at its deadline
        (copies,) = lanes
        return _one_stage_windows((dataclasses.replace(copies, first=copies.last),), lent, columns)
    return _earliest_deadline_first(lanes, lent, columns)


def _earliest_deadline_first(lanes: Sequence[Copies], lent: np.ndarray, columns: int) -> LinkSchedule:
    """`schedule`, stage by stage (on Python numbers: each stage touches a few copies, where numpy's per-call cost
    would dominate)."""
    T = lent.size
    lent_at = lent.astype(np.float64).tolist()
    exposed = [0.0] * T
    work = [copies.work.astype(np.float64).tolist() for copies in lanes]
    left = [list(each) for each in work]
    last = [copies.last.tolist() for copies in lanes]
    column = [copies.column.tolist() for copies in lanes]
    opening = [_by_stage(copies.first, T) for copies in lanes]
    due = [_by_stage(copies.last, T) for copies in lanes]
    parts: list[list[tuple[int, int, float]]] = [[] for _ in lanes]  # (stage, column, work done there)
    heaps: list[list[tuple[int, int]]] = [[] for _ in lanes]  # (deadline, copy): earliest first
    for s in range(T):
        for lane in range(len(lanes)):
            for copy in opening[lane][s]:
                heapq.heappush(heaps[lane], (last[lane][copy], copy))
        waits = [sum(left[lane][copy] for copy in due[lane][s]) - lent_at[s] for lane in range(len(lanes))]
        exposed[s] = max([0.0, *waits])
        for lane in range(len(lanes)):
            capacity, heap, remaining = lent_at[s] + exposed[s], heaps[lane], left[lane]
            while heap and capacity > 0:
                copy = heap[0][1]
                used = min(capacity, remaining[copy])
                remaining[copy] -= used
                parts[lane].append((s, column[lane][copy], used))
                capacity -= used
                if remaining[copy] <= 0:
                    heapq.heappop(heap)
            for copy in due[lane][s]:
                if remaining[copy] > 1e-9 * max(work[lane][copy], 1.0):
                    raise AssertionError(f"internal: copy {copy} of lane {lane} left {remaining[copy]} past its window")
            while heap and heap[0][0] <= s:  # due here, done but for rounding
                heapq.heappop(heap)
    done = tuple(np.zeros((T, columns)) for _ in lanes)
    for lane, lane_parts in enumerate(parts):
        if lane_parts:
            stage, value, used = zip(*lane_parts, strict=True)
            np.add.at(done[lane], (list(stage), list(value)), list(used))
    return LinkSchedule(np.array(exposed), done)


def _one_stage_windows(lanes: Sequence[Copies], lent: np.ndarray, columns: int) -> LinkSchedule:
    """`schedule` where every window is one stage: no copy carries into another stage, so each stage waits for what
    its copies take beyond the time it lends, on its busiest lane (the same schedule, vectorised)."""
    T = lent.size
    done = tuple(np.zeros((T, columns)) for _ in lanes)
    due = np.zeros((len(lanes), T))
    for lane, copies in enumerate(lanes):
        np.add.at(done[lane], (copies.last, copies.column), copies.work)
        due[lane] = done[lane].sum(axis=1)
    exposed = np.maximum(due.max(axis=0, initial=0.0) - lent, 0.0)
    return LinkSchedule(exposed, done)


def _by_stage(stages: np.ndarray, T: int) -> list[list[int]]:
    """Per stage, the copies whose `stages` entry is that stage, in order."""
    order = np.argsort(stages, kind="stable")
    bounds = np.searchsorted(stages[order], np.arange(T + 1)).tolist()
    copies = order.tolist()
    return [copies[bounds[s] : bounds[s + 1]] for s in range(T)]
