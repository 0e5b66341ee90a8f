"""Progress visible by default: while a search runs, a line every `interval` seconds (the elapsed time, the best
plan's extra compute over computing each node once, the proven bound and the gap), so that a long first
`checkmate.compile` is not silent.

The lines are INFO records of this module's logger (`checkmate.progress_lines`). When the program has configured no
logging (no handler on the root logger or `checkmate`'s, no level set on `checkmate`'s), they go to stderr through a
handler attached for the search's duration, as `logging.lastResort` shows warnings; otherwise they go where the
program's logging sends them. `progress=False` (an option of `checkmate.solve` and `checkmate.compile`), or a level
above INFO on the `checkmate` logger, silences them.

Other long work before a search (profiling the ops of a model in `checkmate.compile`) shows its lines the same way
through `work_lines`; `checkmate.compile` passes its `progress` and `progress_interval` to it with `shown`.
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Callable, Iterator
from contextvars import ContextVar

from checkmate.progress import Progress, SearchControl

log = logging.getLogger(__name__)

# Seconds between two lines; the first comes after as long (a short search prints nothing).
INTERVAL = 5.0
PACKAGE_LOGGER = "checkmate"

_attached = threading.Lock()
_users = 0
_handler: logging.Handler | None = None


def describe(snapshot: Progress, base_cost: float) -> str:
    """One progress line: "planning 10 s of 120 s (MILP): best plan +23.1 % extra compute, bound +18.0 %, gap
    4.1 %"; `base_cost` is what computing each node once (and fetching each fetched value once) costs (extra compute
    is over it)."""

    def extra(cost: float | None) -> str:
        if cost is None:
            return "-"
        return f"{cost / base_cost - 1:+.1%}" if base_cost > 0 else f"{cost:.6g}"

    clock = f"{snapshot.elapsed:.0f} s" + ("" if snapshot.time_limit is None else f" of {snapshot.time_limit:.0f} s")
    gap = "-" if snapshot.gap is None else f"{snapshot.gap:.1%}"
    return (
        f"planning {clock} ({snapshot.phase or 'starting'}): best plan {extra(snapshot.best_cost)} extra compute, "
        f"bound {extra(snapshot.bound)}, gap {gap}; Ctrl-C stops with the best plan"
    )


@contextlib.contextmanager
def progress_lines(control: SearchControl, base_cost: float, *, interval: float = INTERVAL) -> Iterator[None]:
    """While inside, log `describe(control.snapshot())` every `interval` seconds (module doc)."""
    with _to_stderr_unless_configured(), _beating(lambda: describe(control.snapshot(), base_cost), interval):
        yield


# Whether `work_lines` shows lines in this context, and every how many seconds (`shown`).
_work_lines: ContextVar[tuple[bool, float | None]] = ContextVar("checkmate_work_lines", default=(True, None))


@contextlib.contextmanager
def shown(enabled: bool, interval: float | None = None) -> Iterator[None]:
    """While inside, `work_lines` shows its lines when `enabled`, every `interval` seconds (None: `INTERVAL`)."""
    token = _work_lines.set((enabled, interval))
    try:
        yield
    finally:
        _work_lines.reset(token)


@contextlib.contextmanager
def work_lines(first: str, now: Callable[[], str]) -> Iterator[None]:
    """Log `first` at once, then `now()` every interval while inside, as a search's lines go (module doc); nothing
    inside `shown(False)`."""
    enabled, interval = _work_lines.get()
    if not enabled:
        yield
        return
    with _to_stderr_unless_configured():
        log.info("%s", first)
        with _beating(now, INTERVAL if interval is None else interval):
            yield


@contextlib.contextmanager
def _beating(line: Callable[[], str], interval: float) -> Iterator[None]:
    """While inside, a thread logs `line()` every `interval` seconds."""
    done = threading.Event()

    def beat() -> None:
        while not done.wait(interval):
            log.info("%s", line())

    thread = threading.Thread(target=beat, name="checkmate-progress", daemon=True)
    thread.start()
    try:
        yield
    finally:
        done.set()
        thread.join()


def _configured() -> bool:
    """Whether the program has set up logging that reaches (or deliberately silences) this module's records."""
    package = logging.getLogger(PACKAGE_LOGGER)
    handlers = [handler for handler in log.handlers if handler is not _handler]
    return bool(handlers) or package.hasHandlers() or package.level != logging.NOTSET


@contextlib.contextmanager
def _to_stderr_unless_configured() -> Iterator[None]:
    """A stderr handler on this module's logger (at INFO) while inside, when logging is not configured; shared by
    searches that run at the same time (threads), removed when the last one ends."""
    global _users, _handler
    with _attached:
        if _handler is None and _configured():
            attached_here = False
        else:
            if _handler is None:
                _handler = logging.StreamHandler()
                _handler.setFormatter(logging.Formatter("checkmate: %(message)s"))
                log.addHandler(_handler)
                log.setLevel(logging.INFO)
            _users += 1
            attached_here = True
    try:
        yield
    finally:
        if attached_here:
            with _attached:
                _users -= 1
                if _users == 0 and _handler is not None:
                    log.removeHandler(_handler)
                    log.setLevel(logging.NOTSET)
                    _handler = None
