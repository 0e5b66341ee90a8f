"""Values moved to host memory and back: the third choice beside keeping a value on the device and recomputing it.

A plan may copy a node's output to host memory in a stage where the output is on the device, and copy it back for
a later stage that reads it, instead of holding it (S) or computing it again (R). The decisions (`Moves`, bool[T, T]
each, in the paper's stage-by-node layout):

* `copy_out[t, i]`: node i's output starts its copy to host memory in stage t;
* `copy_in[t, i]`: it is copied back for stage t: present on the device in stage t as a held value is;
* `buffered[s, i]`: stage s holds the device buffer of node i's next copy back, which fills it: the stages of a
  copy back's buffer form a run that ends the stage before its `copy_in` (a copy back started early, a prefetch).

The rules a plan with moves obeys (`check_moves`), beside the paper's:

* (m1) a copy out of i in stage t needs i on the device there (R[t, i] or S[t, i]) and bytes of its own (an output
  of no bytes is a view of another's storage, or no tensor: nothing to move); each output is copied out at most once
  in a step;
* (m2) a copy back for stage t needs its buffer in stage t - 1; a buffer in stage s goes on into stage s + 1 or ends
  with the copy back for s + 1; and it needs a copy out of i in a stage before s, and i off the device in s
  (R[s, i] = S[s, i] = copy_in[s, i] = 0): a copy back starts once the copy out is complete;
* (m3) a copied-in value is not also computed or held in that stage (R[t, i] = S[t, i] = 0);
* the paper's (1b) and (1c) take a copied-in value as a third source: R[t, j] <= R[t, i] + S[t, i] + copy_in[t, i]
  for each edge (i, j), and S[t + 1, i] <= R[t, i] + S[t, i] + copy_in[t, i].

The memory model, on the device: a copied-in value holds its bytes in stage t from the stage's start as a held value
does (freed after its last reader there unless held into stage t + 1), and its buffer holds them throughout every
stage of its run; a value copied out in stage t stays on the device to the end of stage t, where it is dropped unless
held into stage t + 1. On the host: a copied-out value holds its bytes from its copy out to the end of the step
(`host_peak`), at most the link's `host_memory` (m4).

The time model (`transfer_schedule`) is the link's (`checkmate.link_schedule`, the one every value held elsewhere
is priced by; the fetched values of `checkmate.fetched` are its other instance), with one lane each way (device to
host, host to device), the two at once. A copy's window: a copy out in stage t, that stage and each following stage
whose whole length the value stays on the device (held into the next stage): stages t to e - 1 where the value is
held into stages t + 1 to e; a copy back, the run of its buffer. Each stage lends each lane `HostLink.overlap` x its
compute. A copy costs the link's latency plus its bytes at the direction's cost per byte, in the graph's cost unit.
The MILP's transfer rows (`checkmate.milp.moves`) express the same model.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from checkmate import link_schedule
from checkmate.errors import InvalidSchedule
from checkmate.link_schedule import Copies


@dataclass(frozen=True)
class HostLink:
    """The link between the device and host memory, priced in the graph's cost unit.

    Attributes:
        to_host_per_byte: the cost of one byte copied from the device to host memory.
        to_device_per_byte: the cost of one byte copied from host memory to the device.
        latency: the fixed cost of each copy, either way.
        overlap: the fraction of a stage's compute that copies run beside, hidden (0: every copy adds its time).
        host_memory: the most bytes the moved values may hold in host memory (None: no limit).
    """

    to_host_per_byte: float
    to_device_per_byte: float
    latency: float = 0.0
    overlap: float = 1.0
    host_memory: int | None = None

    def __post_init__(self) -> None:
        figures = (self.to_host_per_byte, self.to_device_per_byte, self.latency)
        if not all(np.isfinite(figure) and figure >= 0 for figure in figures):
            raise ValueError(f"a host link's costs must be finite and >= 0, got {figures}")
        if not 0.0 <= self.overlap <= 1.0:
            raise ValueError(f"a host link's overlap must lie in [0, 1], got {self.overlap}")
        if self.host_memory is not None and (
            isinstance(self.host_memory, bool) or not isinstance(self.host_memory, int) or self.host_memory < 0
        ):
            raise ValueError(f"a host link's host_memory must be a byte count >= 0 or None, got {self.host_memory!r}")

    def to_host_costs(self, sizes: np.ndarray) -> np.ndarray:
        """float64[n]: the cost of copying each of `sizes` bytes to host memory."""
        return self.latency + self.to_host_per_byte * sizes.astype(np.float64)

    def to_device_costs(self, sizes: np.ndarray) -> np.ndarray:
        """float64[n]: the cost of copying each of `sizes` bytes back to the device."""
        return self.latency + self.to_device_per_byte * sizes.astype(np.float64)


@dataclass(frozen=True)
class LinkSpeeds:
    """The link to host memory as the hardware states it (or as measured, `checkmate.execute.host_link`), before it
    is priced in a graph's cost unit.

    Attributes:
        to_host: bytes per second copied from the device to host memory.
        to_device: bytes per second copied from host memory to the device.
        latency: seconds each copy takes beside its bytes, either way.
        overlap: the fraction of a stage's compute that copies run beside, hidden (`HostLink.overlap`).
    """

    to_host: float
    to_device: float
    latency: float = 0.0
    overlap: float = 1.0

    def __post_init__(self) -> None:
        if not (self.to_host > 0 and self.to_device > 0 and np.isfinite(self.to_host * self.to_device)):
            raise ValueError(f"bandwidths must be finite and > 0, got {self.to_host} and {self.to_device}")

    def priced(self, cost_per_second: float = 1.0, host_memory: int | None = None) -> HostLink:
        """The link in a graph's cost unit: `cost_per_second` is 1 for a graph costed in seconds
        (`cost_model="profile"`) and the device's FLOP/s for one costed in FLOPs (`cost_model="flops"`); moved values
        may hold at most `host_memory` bytes of host memory (None: no limit)."""
        if not (cost_per_second > 0 and np.isfinite(cost_per_second)):
            raise ValueError(f"cost_per_second must be finite and > 0, got {cost_per_second}")
        return HostLink(
            to_host_per_byte=cost_per_second / self.to_host,
            to_device_per_byte=cost_per_second / self.to_device,
            latency=cost_per_second * self.latency,
            overlap=self.overlap,
            host_memory=host_memory,
        )


@dataclass(frozen=True)
class Moves:
    """A plan's copies to host memory and back (module doc); empty (shape (0, 0)) for a plan without moves.

    Attributes:
        copy_out: bool[T, T]; copy_out[t, i] = 1 when node i's output starts its copy to host memory in stage t.
        copy_in: bool[T, T]; copy_in[t, i] = 1 when it is copied back for stage t (present there).
        buffered: bool[T, T]; buffered[s, i] = 1 when stage s holds the buffer of node i's next copy back; empty:
            the stage before each copy back only.
    """

    copy_out: np.ndarray = field(default_factory=lambda: np.zeros((0, 0), dtype=bool), compare=False)
    copy_in: np.ndarray = field(default_factory=lambda: np.zeros((0, 0), dtype=bool), compare=False)
    buffered: np.ndarray = field(default_factory=lambda: np.zeros((0, 0), dtype=bool), compare=False)

    @property
    def any(self) -> bool:
        """Whether the plan moves anything."""
        return bool(self.copy_out.any() or self.copy_in.any())

    def copied_in(self, T: int) -> np.ndarray:
        """bool[T, T]: `copy_in`, or all false for a plan without moves."""
        return self.copy_in.astype(bool) if self.copy_in.size else np.zeros((T, T), dtype=bool)

    def copied_out(self, T: int) -> np.ndarray:
        """bool[T, T]: `copy_out`, or all false for a plan without moves."""
        return self.copy_out.astype(bool) if self.copy_out.size else np.zeros((T, T), dtype=bool)

    def buffers(self, T: int) -> np.ndarray:
        """bool[T, T]: `buffered`, or where it is empty, the stage before each copy back."""
        if self.buffered.size:
            return self.buffered.astype(bool)
        before = np.zeros((T, T), dtype=bool)
        before[:-1] = self.copied_in(T)[1:]
        return before


NO_MOVES = Moves()


def check_moves(R: np.ndarray, S: np.ndarray, moves: Moves, sizes: np.ndarray, link: HostLink | None) -> None:
    """Raise InvalidSchedule naming the first rule (m1)-(m4) of the module doc that `moves` breaks for the plan
    (R, S) on a graph of output `sizes` with the host `link`; the paper's (1b) and (1c) with copied-in values are
    checked by `checkmate.simulate.check_plan`."""
    T = R.shape[0]
    if not moves.copy_out.size and not moves.copy_in.size:
        return
    for name, matrix in (("copy_out", moves.copy_out), ("copy_in", moves.copy_in)):
        if matrix.shape != (T, T):
            raise InvalidSchedule(f"{name} has shape {matrix.shape}; the graph has {T} nodes, so it must be ({T}, {T})")
    out, back = moves.copy_out.astype(bool), moves.copy_in.astype(bool)
    on_device = R.astype(bool) | S.astype(bool)
    stranded = np.argwhere(out & ~on_device)
    if stranded.size:
        t, i = stranded[0]
        raise InvalidSchedule(f"(m1) copy_out[{t}, {i}] = 1 but node {i} is neither computed nor held in stage {t}")
    empty = np.flatnonzero(out.any(axis=0) & (sizes <= 0))
    if empty.size:
        raise InvalidSchedule(f"(m1) node {empty[0]}'s output is copied out but holds no bytes of its own")
    twice = np.flatnonzero(out.sum(axis=0) > 1)
    if twice.size:
        raise InvalidSchedule(f"(m1) node {twice[0]}'s output is copied out {int(out[:, twice[0]].sum())} times")
    doubled = np.argwhere(back & on_device)
    if doubled.size:
        t, i = doubled[0]
        raise InvalidSchedule(f"(m3) copy_in[{t}, {i}] = 1 but node {i} is also computed or held in stage {t}")
    buffer = moves.buffers(T)
    if buffer.shape != (T, T):
        raise InvalidSchedule(f"buffered has shape {buffer.shape}; the graph has {T} nodes, so it must be ({T}, {T})")
    unbuffered = np.argwhere(back & ~np.vstack([np.zeros((1, T), dtype=bool), buffer[:-1]]))
    if unbuffered.size:
        t, i = unbuffered[0]
        raise InvalidSchedule(f"(m2) copy_in[{t}, {i}] = 1 but stage {t - 1} holds no buffer for it (buffered)")
    ends = np.vstack([buffer[1:] | back[1:], np.zeros((1, T), dtype=bool)])
    dangling = np.argwhere(buffer & ~ends)
    if dangling.size:
        s, i = dangling[0]
        raise InvalidSchedule(
            f"(m2) buffered[{s}, {i}] = 1 but no buffer or copy back of node {i} follows in stage {s + 1}"
        )
    early = np.argwhere(buffer & ~on_host_by(out))
    if early.size:
        s, i = early[0]
        raise InvalidSchedule(f"(m2) buffered[{s}, {i}] = 1 but node {i} was not copied out before stage {s}")
    present = np.argwhere(buffer & (on_device | back))
    if present.size:
        s, i = present[0]
        raise InvalidSchedule(f"(m2) buffered[{s}, {i}] = 1 but node {i} is on the device in stage {s}")
    if not moves.any:
        return
    if link is None:
        raise InvalidSchedule("the plan moves values to host memory but the graph has no host_link to price them")
    held = host_peak(sizes, moves, T)
    if link.host_memory is not None and held > link.host_memory:
        raise InvalidSchedule(
            f"(m4) the moves hold {held} bytes in host memory, over the host link's host_memory of {link.host_memory}"
        )


def on_host_by(copy_out: np.ndarray) -> np.ndarray:
    """bool[T, T]: where a copy back's buffer may be (m2): the output was copied out in an earlier stage."""
    ready = np.zeros(copy_out.shape, dtype=bool)
    ready[1:] = np.logical_or.accumulate(copy_out, axis=0)[:-1]
    return ready


def buffered_bytes(sizes: np.ndarray, moves: Moves, T: int) -> np.ndarray:
    """int64[T]: per stage, the bytes of the copies back whose buffers it holds."""
    return moves.buffers(T).astype(np.int64) @ sizes.astype(np.int64)


def copy_out_windows(S: np.ndarray, moves: Moves) -> np.ndarray:
    """bool[T, T]: the stages of each copy out's window (module doc): its stage t, and each next stage s while the
    value is held into s + 1."""
    T = S.shape[0]
    window = moves.copied_out(T).copy()
    held_next = np.zeros((T, T), dtype=bool)
    held_next[:-1] = S[1:].astype(bool)
    for t in range(1, T):
        window[t] |= window[t - 1] & held_next[t]
    return window


def stages_covering(free: np.ndarray, start: int, work: float, *, forward: bool = True) -> int:
    """The stage where the link's `free` time (>= 0 in every stage) from `start` on (forward) or back (not) first
    covers `work`: the last stage that way where it never does."""
    last = free.size - 1 if forward else 0
    if not 0 <= start < free.size:
        return last
    totals = np.cumsum(free[start:] if forward else free[start::-1])  # free is >= 0: the totals never fall
    reached = int(np.searchsorted(totals, work, side="left"))
    if reached == totals.size:
        return last
    return start + reached if forward else start - reached


def host_peak(sizes: np.ndarray, moves: Moves, T: int) -> int:
    """The most bytes host memory holds: every copied-out value, from its copy out to the end of the step."""
    return int(moves.copied_out(T).any(axis=0).astype(np.int64) @ sizes.astype(np.int64))


@dataclass(frozen=True)
class TransferSchedule:
    """The link's work as the time model schedules it (module doc).

    Attributes:
        exposed: float64[T]; per stage, the time the step waits there for copies (added to its compute).
        to_host: float64[T, T]; to_host[s, i], the part of node i's copy out done in stage s.
        to_device: float64[T, T]; to_device[s, i], the part of a copy back of node i done in stage s.
    """

    exposed: np.ndarray
    to_host: np.ndarray
    to_device: np.ndarray


def transfer_schedule(
    sizes: np.ndarray, link: HostLink | None, moves: Moves, S: np.ndarray, stage_compute: np.ndarray
) -> TransferSchedule:
    """Schedule the copies of `moves` (valid for a plan with holds `S`, on a graph of output `sizes`) on the `link`,
    stage by stage, earliest deadline first (module doc; `checkmate.link_schedule`, one lane each way)."""
    T = stage_compute.size
    zeros = np.zeros((T, T))
    if link is None or not moves.any:
        return TransferSchedule(np.zeros(T), zeros, zeros.copy())
    lanes = (
        _copies(copy_out_windows(S, moves), moves.copied_out(T), link.to_host_costs(sizes), first_is_start=True),
        _copies(moves.buffers(T), moves.copied_in(T), link.to_device_costs(sizes), first_is_start=False),
    )
    work = link_schedule.schedule(lanes, link.overlap * stage_compute.astype(np.float64), T)
    return TransferSchedule(work.exposed, work.done[0], work.done[1])


def _copies(window: np.ndarray, marks: np.ndarray, costs: np.ndarray, *, first_is_start: bool) -> Copies:
    """The copies of one direction from its `window` runs, in order of (first stage, node): a copy out's run starts
    at its mark (`first_is_start`); a copy back's run ends the stage before its mark."""
    T = window.shape[0]
    runs: list[tuple[int, int, int]] = []
    for i in np.flatnonzero(window.any(axis=0)).tolist():
        stages = np.flatnonzero(window[:, i])
        for run in np.split(stages, np.flatnonzero(np.diff(stages) > 1) + 1):
            start, end = int(run[0]), int(run[-1])
            if marks[start, i] if first_is_start else (end + 1 < T and marks[end + 1, i]):
                runs.append((start, i, end))
    runs.sort()
    first, column, last = (np.array([run[k] for run in runs], dtype=np.int64) for k in range(3))
    return Copies(costs[column].astype(np.float64), first, last, column)


def exposed_transfer_times(
    sizes: np.ndarray, link: HostLink | None, moves: Moves, S: np.ndarray, stage_compute: np.ndarray
) -> np.ndarray:
    """float64[T]: per stage, the time the step waits there for copies (`transfer_schedule`)."""
    return transfer_schedule(sizes, link, moves, S, stage_compute).exposed


@dataclass(frozen=True)
class Transfers:
    """What a plan's moves carry and cost (`transfers`).

    Attributes:
        bytes_to_host: bytes copied from the device to host memory in a step.
        bytes_to_device: bytes copied back (a value copied back twice counts twice).
        transfer_time: the copies' cost on the link, both directions, in the graph's cost unit.
        exposed_time: what they add to the step's time (`exposed_transfer_times`, summed).
    """

    bytes_to_host: int
    bytes_to_device: int
    transfer_time: float
    exposed_time: float

    @property
    def hidden(self) -> float:
        """The fraction of the copies' time hidden beside compute (1 when they take none)."""
        return 1.0 - self.exposed_time / self.transfer_time if self.transfer_time > 0 else 1.0


def transfers(
    sizes: np.ndarray, link: HostLink | None, moves: Moves, S: np.ndarray, stage_compute: np.ndarray
) -> Transfers:
    """The bytes, cost and exposed time of `moves` on a graph of output `sizes` and host `link`, for a plan with holds
    `S` whose stages compute `stage_compute` (float[T])."""
    T = stage_compute.size
    if link is None or not moves.any:
        return Transfers(0, 0, 0.0, 0.0)
    out_count = moves.copied_out(T).sum(axis=0).astype(np.int64)
    in_count = moves.copied_in(T).sum(axis=0).astype(np.int64)
    sizes = sizes.astype(np.int64)
    cost = float(out_count @ link.to_host_costs(sizes) + in_count @ link.to_device_costs(sizes))
    exposed = float(exposed_transfer_times(sizes, link, moves, S, stage_compute).sum())
    return Transfers(int(out_count @ sizes), int(in_count @ sizes), cost, exposed)
