"""A live status line for long searches on a terminal: `checkmate.progress.Progress` snapshots shown through tqdm.

    with ProgressDisplay() as display:
        plan = solve(graph, budget, method="optimal", progress=display)
    display.summarize(plan)

The line appears once a search has run for `delay` seconds, shows the elapsed time (ticking between reports),
the phase, the best cost, the bound and the gap, and is erased when the display closes. It is written to stderr,
and only when stderr is a terminal: otherwise the display prints nothing (the log has the same figures).
"""

from __future__ import annotations

import io
import os
import sys
import threading
import time
from types import TracebackType
from typing import Any, Protocol, TextIO

from checkmate.progress import Progress

# Show the line once a search has run this long (seconds).
DELAY = 2.0
# Redraw the line this often (seconds) between reports, so the clock keeps moving while a solver is busy.
REFRESH = 1.0


class _Summarizable(Protocol):  # a Plan
    @property
    def status(self) -> str: ...

    @property
    def gap(self) -> float | None: ...


def format_progress(progress: Progress, elapsed: float | None = None) -> str:
    """The status line for a snapshot: elapsed (of the time limit), phase, best cost, bound, gap."""
    seconds = progress.elapsed if elapsed is None else elapsed
    clock = f"{seconds:.0f} s" if progress.time_limit is None else f"{seconds:.0f}/{progress.time_limit:.0f} s"
    parts = [f"checkmate {clock}", progress.phase]
    parts.append("best -" if progress.best_cost is None else f"best {progress.best_cost:.6g}")
    parts.append("bound -" if progress.bound is None else f"bound {progress.bound:.6g}")
    gap = progress.gap
    parts.append("gap -" if gap is None else f"gap {gap:.2%}")
    parts.append("Ctrl-C: stop with the best plan")
    return " | ".join(parts)


def _columns(stream: TextIO) -> int:
    """The terminal's width, less one (a line as wide as the terminal would wrap); 120 when it reports none."""
    try:
        columns = os.get_terminal_size(stream.fileno()).columns
    except (AttributeError, ValueError, OSError, io.UnsupportedOperation):
        columns = 0
    return (columns or 121) - 1


def _is_terminal(stream: TextIO) -> bool:
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError):  # no isatty, or a closed stream
        return False


class ProgressDisplay:
    """A progress callback (`checkmate.progress.ProgressCallback`) that keeps a tqdm status line up to date.

    Use it as a context manager (the line is erased and the redraw thread stopped on exit) and pass it as
    `progress=` to `checkmate.solve`. Callable from any thread.

    Args:
        stream: where the line goes (default sys.stderr at construction).
        enabled: show anything at all (default: only when `stream` is a terminal).
        delay: seconds of search before the line appears.
        refresh: seconds between redraws without a report (None: redraw only on reports).
    """

    def __init__(
        self,
        stream: TextIO | None = None,
        *,
        enabled: bool | None = None,
        delay: float = DELAY,
        refresh: float | None = REFRESH,
    ) -> None:
        self.stream: TextIO = sys.stderr if stream is None else stream
        self.enabled = _is_terminal(self.stream) if enabled is None else enabled
        self.delay = delay
        self.refresh = refresh
        self.last: Progress | None = None
        self._received = 0.0  # time.perf_counter() when `last` arrived
        self._bar: Any = None
        self._lock = threading.Lock()
        self._closed = threading.Event()
        self._thread: threading.Thread | None = None

    def __enter__(self) -> ProgressDisplay:
        if self.enabled and self.refresh is not None and self._thread is None:
            self._thread = threading.Thread(target=self._tick, name="checkmate-progress", daemon=True)
            self._thread.start()
        return self

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, traceback: TracebackType | None
    ) -> None:
        self.close()

    def __call__(self, progress: Progress) -> None:
        with self._lock:
            self.last = progress
            self._received = time.perf_counter()
            self._draw(progress.elapsed)

    def close(self) -> None:
        """Stop redrawing and erase the line (idempotent)."""
        self._closed.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join()
        self._thread = None
        with self._lock:
            if self._bar is not None:
                self._bar.close()
                self._bar = None

    def summarize(self, plan: _Summarizable) -> None:
        """After a search that reported progress: when its plan is not proven optimal, say on the stream that it
        is the best found (the time ran out, Ctrl-C stopped it, or the bound did not close). Nothing when disabled.
        """
        if not self.enabled or self.last is None or plan.status == "optimal":
            return
        gap = "" if plan.gap is None else f" (gap {plan.gap:.2%} to the bound)"
        self.stream.write(
            f"checkmate: the search stopped before proving optimality (time limit, Ctrl-C, or an open gap); "
            f"this is the best plan found{gap}\n"
        )
        self.stream.flush()

    def _draw(self, elapsed: float) -> None:
        """Show `last` with `elapsed` seconds on the clock (call with the lock held)."""
        if not self.enabled or self.last is None or self._closed.is_set() or elapsed < self.delay:
            return
        if self._bar is None:
            from tqdm import tqdm

            # nrows: tqdm draws nothing when it reads a size of 0 x 0 (a terminal that reports none)
            self._bar = tqdm(file=self.stream, bar_format="{desc}", leave=False, nrows=24)
        self._bar.ncols = _columns(self.stream)  # tqdm cuts the line to this width (read afresh: resizes)
        self._bar.set_description_str(format_progress(self.last, elapsed), refresh=True)

    def _tick(self) -> None:
        assert self.refresh is not None
        while not self._closed.wait(self.refresh):
            with self._lock:
                if self.last is not None:
                    elapsed = self.last.elapsed + time.perf_counter() - self._received
                    if self.last.time_limit is not None:  # (compare: the last search may be over)
                        elapsed = min(elapsed, max(self.last.elapsed, self.last.time_limit))
                    self._draw(elapsed)
