"""Long solves: one clock for the whole call, progress reports, and a polite stop (Ctrl-C).

A strategy that searches (optimal, approx) receives a `SearchControl`. It asks the control how much time is
left before each phase, reports what it has (best cost, proven bound) as it goes, and stops early, returning the
best plan so far, once `stopped` is true. `checkmate.solve` builds the control from `time_limit` and `progress`,
and while it runs (in the main thread) the first Ctrl-C sets `stopped` instead of raising KeyboardInterrupt.
"""

from __future__ import annotations

import contextlib
import logging
import signal
import threading
import time
from collections.abc import Callable, Iterator
from contextvars import ContextVar
from dataclasses import dataclass, field
from types import FrameType

log = logging.getLogger(__name__)

# Report to the log when the phase changes, and otherwise at most this often (seconds).
LOG_INTERVAL = 5.0


@dataclass(frozen=True)
class Progress:
    """A snapshot of a search.

    Attributes:
        elapsed: seconds since the call started.
        phase: what the search is doing (for example "baselines", "LP bound", "coarse MILP", "refine").
        best_cost: the cost of the best plan found so far for the graph given, or None.
        bound: the best lower bound proven so far for the graph given, or None.
        time_limit: seconds allowed for the whole call, or None.
    """

    elapsed: float
    phase: str
    best_cost: float | None = None
    bound: float | None = None
    time_limit: float | None = None

    @property
    def gap(self) -> float | None:
        """(best_cost - bound) / best_cost, when both are known."""
        if self.best_cost is None or self.bound is None:
            return None
        return max(0.0, (self.best_cost - self.bound) / self.best_cost) if self.best_cost > 0 else 0.0

    def describe(self) -> str:
        """One line: elapsed, phase, best, bound and gap."""
        parts = [f"{self.elapsed:6.1f} s", self.phase]
        if self.best_cost is not None:
            parts.append(f"best {self.best_cost:.6g}")
        if self.bound is not None:
            parts.append(f"bound {self.bound:.6g}")
        if self.gap is not None:
            parts.append(f"gap {100 * self.gap:.2f}%")
        return ", ".join(parts)


ProgressCallback = Callable[[Progress], None]


@dataclass
class SearchControl:
    """The clock, the progress sink and the stop flag of one search (mutable: it tracks the best so far).

    Attributes:
        time_limit: seconds for the whole call, or None.
        callback: called with every Progress, or None.
        started: time.perf_counter() at the start of the call.
        best_cost, bound, phase: the best cost and bound reported so far, and the phase last reported.
    """

    time_limit: float | None = None
    callback: ProgressCallback | None = None
    started: float = field(default_factory=time.perf_counter)
    best_cost: float | None = None
    bound: float | None = None
    phase: str = ""
    _stop: threading.Event = field(default_factory=threading.Event)
    _logs: bool = True
    _last_log: float = -float("inf")
    _last_phase: str = ""

    @property
    def elapsed(self) -> float:
        return time.perf_counter() - self.started

    def remaining(self) -> float | None:
        """Seconds left (never negative), or None without a limit."""
        return None if self.time_limit is None else max(0.0, self.time_limit - self.elapsed)

    def share(self, fraction: float, *, minimum: float = 0.0) -> float | None:
        """`fraction` of the time left (at least `minimum`, at most what is left), or None without a limit."""
        left = self.remaining()
        return None if left is None else min(left, max(minimum, fraction * left))

    @property
    def stopped(self) -> bool:
        """True once the time is up or a stop was requested (Ctrl-C): return the best plan so far."""
        left = self.remaining()
        return self._stop.is_set() or (left is not None and left <= 0.0)

    @property
    def interrupted(self) -> bool:
        """True when a stop was requested (not merely the time limit reached)."""
        return self._stop.is_set()

    def snapshot(self) -> Progress:
        """Where the search stands now (safe to call from another thread)."""
        return Progress(self.elapsed, self.phase, self.best_cost, self.bound, self.time_limit)

    def request_stop(self) -> None:
        self._stop.set()

    def child(self, time_limit: float | None, *, reports: bool = True) -> SearchControl:
        """A clock for one phase: at most `time_limit` seconds (and no longer than this control has left), stopped
        with this control. With `reports`, what it reports goes to this control's callback; without, nowhere (for
        phases whose costs and bounds are not those of the graph the caller plans, such as a coarse graph's).
        """
        left = self.remaining()
        limits = [limit for limit in (time_limit, left) if limit is not None]
        return SearchControl(
            time_limit=min(limits) if limits else None,
            callback=self._forward if reports else None,
            _stop=self._stop,
            _logs=False,
        )

    def _forward(self, snapshot: Progress) -> None:
        self.report(snapshot.phase, cost=snapshot.best_cost, bound=snapshot.bound)

    def report(self, phase: str, *, cost: float | None = None, bound: float | None = None) -> None:
        """Record a plan's cost and a proven bound (both for the graph given), and pass the snapshot on."""
        if cost is not None and (self.best_cost is None or cost < self.best_cost):
            self.best_cost = cost
        if bound is not None and (self.bound is None or bound > self.bound):
            self.bound = bound
        self.phase = phase
        snapshot = self.snapshot()
        if self._logs and (phase != self._last_phase or snapshot.elapsed - self._last_log >= LOG_INTERVAL):
            self._last_log, self._last_phase = snapshot.elapsed, phase
            log.info("%s", snapshot.describe())
        if self.callback is not None:
            self.callback(snapshot)


# Set once Ctrl-C stopped a search of the call in progress (`interrupt_scope`); None outside any scope.
_interrupted: ContextVar[threading.Event | None] = ContextVar("checkmate_interrupted", default=None)


@contextlib.contextmanager
def interrupt_scope() -> Iterator[threading.Event]:
    """One Ctrl-C for a call that runs several searches (`checkmate.compile` plans several captures): the event
    yielded is set once Ctrl-C stopped one of them, and every later search of the scope starts stopped (it answers
    at once with what it has; Ctrl-C during it raises KeyboardInterrupt). Outside a search Ctrl-C raises
    KeyboardInterrupt as usual. A scope inside another is the same scope."""
    outer = _interrupted.get()
    if outer is not None:
        yield outer
        return
    interrupted = threading.Event()
    token = _interrupted.set(interrupted)
    try:
        yield interrupted
    finally:
        _interrupted.reset(token)


@contextlib.contextmanager
def stop_on_interrupt(control: SearchControl) -> Iterator[None]:
    """While inside, the first Ctrl-C asks `control` to stop (the search returns its best plan); a second one
    raises KeyboardInterrupt as usual. Inside an `interrupt_scope` whose search was stopped already, `control` is
    stopped at once. Outside the main thread signals cannot be caught, and nothing changes.
    """
    scope = _interrupted.get()
    if scope is not None and scope.is_set():
        control.request_stop()
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def on_interrupt(signum: int, frame: FrameType | None) -> None:
        if control.interrupted:
            raise KeyboardInterrupt
        log.warning("interrupted: finishing with the best plan so far (Ctrl-C again to abort)")
        control.request_stop()
        if scope is not None:
            scope.set()

    previous = signal.signal(signal.SIGINT, on_interrupt)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)
