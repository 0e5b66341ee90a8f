"""Values the step keeps elsewhere and fetches over a link before nodes read them, and when each is present.

An FSDP2 unit's parameters are such a value: each rank holds a shard, and the full parameters exist on the device
only between an all-gather and a free (`checkmate.sharded`). A plan decides, beside R and S, in which stages each
fetched value is present (`presence`, bool[T, F]); a stage where it becomes present fetches it once, at the value's
`fetch_cost`. The rules a presence obeys (`check_presence`):

* present in every stage that runs one of its readers (R[t, i] = 1 for a reader i);
* its end is the later of its `last_use` and the last stage that runs a reader (FSDP2's reduce-scatter releases a
  unit after its last step): present at its end and absent after it;
* from `backward_start` to its end, present on one interval (a unit is gathered once for its backward);
* `kept`: present from its first reader's stage to its end (FSDP2's `reshard_after_forward=False`);
* `released_before_backward`: absent at `backward_start` (the unit is freed after its forward and gathered again).

The memory model: a present value holds `memory` bytes at every moment of the stage (the simulator, the MILP and the
bounds count it so). On a graph that prefetches (`Graph.prefetch`), a fetch that makes a value present in stage t
starts at the start of stage t - 1 and fills a buffer of the value's bytes there: the value is on the device
(`on_device`) in stage t - 1 too. So where and in which order values are prefetched, and how far ahead of their
first reader (a value present from stage s before a reader at r > s is fetched from stage s - 1), are the plan's
decisions, paid in memory like any other. A fetch may hold more than the value while it runs (FSDP2's all-gather:
its flat buffer beside the parameters it is copied into, and gloo's copies of both): `fetch_workspace` bytes
at the start of the stage that fetches, where the fetch runs (`fetching_in_stages`: a stage's opening, as
`Graph.opening_held` counts it), and on a graph that prefetches `in_flight_workspace` bytes beside the buffer through
the stage before (`held_in_stages`). Both follow the plan's fetches, so wherever a plan moves a fetch, what it holds
is counted there.

The time model is the link's (`checkmate.link_schedule`, the one every value held elsewhere is priced by; the
values moved to host memory, `checkmate.moved`, are its other instance), with one lane and a slot per stage boundary:
slot k runs beside the compute of stage k - 1 (none for slot 0) and ends where stage k starts; slot T runs beside the
last stage, slot T + 1 after it. Each stage lends the lane the graph's `fetch_overlap` x its compute (only a graph
that prefetches has `fetch_overlap` > 0). The fetches that make values present in stage t are copies in slot t (one
after another, at their `fetch_cost`s): what the stage before does not hide is waited for at the start of stage t
(per stage t, max(0, fetches of t - fetch_overlap * compute of t - 1)). A value's release (`release_cost`, FSDP2's
reduce-scatter) is a copy that starts after its end stage e and is complete at the end of the step: slots e + 2 to
T + 1, behind the fetches (earliest deadline first), beside the compute of the stages after e; what they do not hide
is waited for at the end of the step (FSDP2 waits for every reduce-scatter there). `exposed_fetch_times` counts each
slot's wait in the stage that waits (slots T and T + 1 in the last). With `fetch_overlap` 0, every fetch and release
is exposed (on CPU ranks a collective's copies in and out run on the cores compute uses).

`default_presence` is FSDP2's own rule (fetched for the forward reads, freed, fetched again for the backward),
the presence of every plan whose strategy does not decide it.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import numpy as np

from checkmate import link_schedule
from checkmate.errors import InvalidSchedule
from checkmate.link_schedule import Copies


@dataclass(frozen=True)
class FetchedValue:
    """A value held elsewhere and fetched onto the device for the nodes that read it (see the module doc).

    Attributes:
        name: a label.
        memory: bytes it holds on the device while present.
        readers: the nodes whose runs need it present.
        fetch_cost: the time of one fetch, in the graph's cost unit.
        last_use: the stage of its last use by other nodes than its readers (FSDP2: the unit's last gradient); it
            ends there or at a later stage that runs a reader.
        backward_start: from this stage to its end it is present on one interval.
        kept: once fetched, present to its end.
        released_before_backward: absent at `backward_start`.
        fetch_workspace: bytes a fetch holds beside the value through the stage it makes the value present.
        in_flight_workspace: on a graph that prefetches, bytes a fetch holds beside its buffer through the stage
            before (module doc).
        release_cost: the time of handing it back once, after its end (FSDP2: the reduce-scatter of the unit's
            gradients), in the graph's cost unit.
    """

    name: str
    memory: int
    readers: tuple[int, ...]
    fetch_cost: float
    last_use: int
    backward_start: int
    kept: bool = False
    released_before_backward: bool = False
    fetch_workspace: int = 0
    in_flight_workspace: int = 0
    release_cost: float = 0.0


def fetch_bytes(value: FetchedValue) -> int:
    """The most bytes a value and its fetch hold on the device in one stage."""
    return value.memory + value.fetch_workspace + value.in_flight_workspace


def kept_throughout(values: tuple[FetchedValue, ...]) -> tuple[FetchedValue, ...]:
    """`values`, each that may be held from its forward to its backward kept from its first read to its end."""
    return tuple(value if value.released_before_backward else dataclasses.replace(value, kept=True) for value in values)


def read_stages(values: tuple[FetchedValue, ...], R: np.ndarray) -> np.ndarray:
    """bool[T, F]: the stages that run a reader of each value."""
    reads = np.zeros((R.shape[0], len(values)), dtype=bool)
    for column, value in enumerate(values):
        if value.readers:
            reads[:, column] = R[:, list(value.readers)].any(axis=1)
    return reads


def ends(values: tuple[FetchedValue, ...], reads: np.ndarray) -> np.ndarray:
    """int64[F]: each value's end (module doc) for the reading stages `reads` (`read_stages`)."""
    last_read = np.where(reads.any(axis=0), reads.shape[0] - 1 - np.argmax(reads[::-1], axis=0), -1)
    return np.maximum(np.array([value.last_use for value in values], dtype=np.int64), last_read)


def default_presence(values: tuple[FetchedValue, ...], R: np.ndarray) -> np.ndarray:
    """bool[T, F]: FSDP2's presence for the plan's runs R: from the first to the last reading stage before
    `backward_start`, and from the first reading stage after it to the value's end (kept values: from the first
    reading stage to the end)."""
    T = R.shape[0]
    reads = read_stages(values, R)
    presence = np.zeros((T, len(values)), dtype=bool)
    for column, (value, end) in enumerate(zip(values, ends(values, reads), strict=True)):
        stages = np.flatnonzero(reads[:, column])
        if value.kept:
            first = int(stages[0]) if stages.size else end
            presence[first : end + 1, column] = True
            continue
        forward = stages[stages < value.backward_start]
        if forward.size:
            presence[forward[0] : forward[-1] + 1, column] = True
        backward = stages[stages >= value.backward_start]
        first = int(backward[0]) if backward.size else end
        presence[min(first, end) : end + 1, column] = True
    return presence


def rises(presence: np.ndarray) -> np.ndarray:
    """bool[T, F]: the stages where each value becomes present, which fetch it."""
    before = np.vstack([np.zeros((1, presence.shape[1]), dtype=bool), presence[:-1]])
    return presence & ~before


def fetches(presence: np.ndarray) -> np.ndarray:
    """int64[F]: how many times each value is fetched."""
    return rises(presence).sum(axis=0).astype(np.int64)


def fetch_link_schedule(
    values: tuple[FetchedValue, ...], presence: np.ndarray, stage_compute: np.ndarray, overlap: float
) -> link_schedule.LinkSchedule:
    """The fetches and releases of `presence` on the link (module doc): T + 2 slots, one lane, its columns the values'
    fetches then their releases (F + v); each value's end is its last present stage."""
    T, F = presence.shape
    fetch_costs = np.array([value.fetch_cost for value in values], dtype=np.float64)
    release_costs = np.array([value.release_cost for value in values], dtype=np.float64)
    slot, fetched = np.nonzero(rises(presence))
    released = np.flatnonzero((release_costs > 0) & presence.any(axis=0))
    end = T - 1 - np.argmax(presence[::-1, released], axis=0)
    copies = Copies(
        np.concatenate([fetch_costs[fetched], release_costs[released]]),
        np.concatenate([slot, end + 2]).astype(np.int64),
        np.concatenate([slot, np.full(released.size, T + 1)]).astype(np.int64),
        np.concatenate([fetched, F + released]).astype(np.int64),
    )
    lent = overlap * np.concatenate([[0.0], stage_compute, [0.0]]).astype(np.float64)
    return link_schedule.schedule((copies,), lent, 2 * F)


def exposed_fetch_times(
    values: tuple[FetchedValue, ...], presence: np.ndarray, stage_compute: np.ndarray, overlap: float
) -> np.ndarray:
    """float64[T]: per stage, the time it waits for fetches and releases that compute does not hide (module doc):
    `stage_compute` is the compute of each stage, `overlap` the fraction of a stage's compute the link runs beside."""
    waits = fetch_link_schedule(values, presence, stage_compute, overlap).exposed
    return np.concatenate([waits[:-3], [waits[-3:].sum()]])


def on_device(presence: np.ndarray, prefetch: bool) -> np.ndarray:
    """bool[T, F]: the stages where each value holds its bytes on the device: where it is present and, when fetches
    are prefetched, the stage before each fetch (module doc)."""
    if not prefetch:
        return presence.astype(bool)
    ahead = np.vstack([rises(presence)[1:], np.zeros((1, presence.shape[1]), dtype=bool)])
    return presence.astype(bool) | ahead


def present_bytes(values: tuple[FetchedValue, ...], presence: np.ndarray, prefetch: bool) -> np.ndarray:
    """int64[T]: the bytes the values and their prefetches hold on the device at every moment of each stage
    (`on_device`, and each prefetch's in-flight workspace: module doc)."""
    memory, _, in_flight = fetched_amounts(values)
    return held_in_stages(presence, prefetch, memory, in_flight)


def fetching_bytes(values: tuple[FetchedValue, ...], presence: np.ndarray) -> np.ndarray:
    """int64[T]: the bytes the fetches that make values present in each stage hold at its start, beside the values
    (`fetch_workspace`: module doc)."""
    return fetching_in_stages(presence, fetched_amounts(values)[1])


def fetched_amounts(values: tuple[FetchedValue, ...]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """int64[F] each: the values' bytes, their fetches' workspaces and their in-flight workspaces."""
    return (
        np.array([value.memory for value in values], dtype=np.int64),
        np.array([value.fetch_workspace for value in values], dtype=np.int64),
        np.array([value.in_flight_workspace for value in values], dtype=np.int64),
    )


def held_in_stages(presence: np.ndarray, prefetch: bool, memory: np.ndarray, in_flight: np.ndarray) -> np.ndarray:
    """[T]: per stage, `memory` of each value on the device (`on_device`), and on a graph that prefetches `in_flight`
    of each fetch in the stage before the one it makes its value present in (in whatever amounts the arrays are:
    bytes, or a MILP's units)."""
    held = on_device(presence, prefetch).astype(memory.dtype) @ memory
    if prefetch:
        held[:-1] += rises(presence)[1:].astype(memory.dtype) @ in_flight
    return held


def fetching_in_stages(presence: np.ndarray, fetch_workspace: np.ndarray) -> np.ndarray:
    """[T]: per stage, `fetch_workspace` of each fetch that makes its value present there, held at the stage's
    start (in whatever amounts the array is)."""
    return rises(presence).astype(fetch_workspace.dtype) @ fetch_workspace


def check_presence(values: tuple[FetchedValue, ...], R: np.ndarray, presence: np.ndarray) -> None:
    """Raise InvalidSchedule naming the first rule of the module doc that `presence` breaks for the runs R."""
    T = R.shape[0]
    if presence.shape != (T, len(values)):
        raise InvalidSchedule(f"presence has shape {presence.shape}; it must be ({T}, {len(values)})")
    reads = read_stages(values, R)
    for column, (value, end) in enumerate(zip(values, ends(values, reads), strict=True)):
        present = presence[:, column].astype(bool)
        label = f"fetched value {column} ({value.name!r})"
        missing = np.flatnonzero(reads[:, column] & ~present)
        if missing.size:
            raise InvalidSchedule(f"{label} is read in stage {missing[0]} but not present there")
        if not present[end] or present[end + 1 :].any():
            raise InvalidSchedule(f"{label} must be present at its end, stage {end}, and absent after it")
        tail = present[value.backward_start : end + 1]
        if (np.diff(tail.astype(np.int8)) < 0).any():
            raise InvalidSchedule(
                f"{label} must be present on one interval ending at its end ({end}) from stage {value.backward_start}"
            )
        if value.kept:
            first = np.flatnonzero(reads[:, column])
            start = int(first[0]) if first.size else end
            if not present[start : end + 1].all():
                raise InvalidSchedule(f"{label} is kept: it must be present from stage {start} to {end}")
        if value.released_before_backward and value.backward_start < T and present[value.backward_start]:
            raise InvalidSchedule(
                f"{label} must be absent at stage {value.backward_start}, between its forward and its backward"
            )
