"""Where the time of planning a step goes: seconds per stage (capture, node compilation and measuring, solving, the
fused runs), recorded as the stages run.

    with recording() as times:
        ...                                   # code that runs `with timed(Stage.SOLVE): ...` somewhere inside
    print(times())                            # StageTimes: each stage's seconds, the total and the rest

Outside `recording`, `timed` records nothing, so library code times its stages whether or not anyone asks.
"""

from __future__ import annotations

import enum
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass


class Stage(enum.Enum):
    """A stage of planning a step."""

    CAPTURE = "capture"  # tracing the step (and profiling its ops, with the eager executor's "profile" costs)
    NODE_COMPILE = "node compile"  # the Inductor executor compiling each planning node
    NODE_MEASURE = "node measure"  # the Inductor executor timing each compiled node and reading the allocator
    SOLVE = "solve"  # the plans without recomputation and within the budget, from the plan cache when there
    FUSED_RUNS = "fused runs"  # the Inductor executor compiling and measuring runs of the chosen schedule


@dataclass(frozen=True)
class StageTimes:
    """Seconds spent in each stage of one planning, and in all of it.

    Attributes:
        seconds: seconds of each stage that ran, in `Stage` order.
        captures: captures of the step planned (the executor's capture choices tried).
        total: seconds from the start of the planning to its end; `other` is what no stage counts.
    """

    seconds: tuple[tuple[Stage, float], ...]
    captures: int
    total: float

    def of(self, stage: Stage) -> float:
        """Seconds of `stage` (0 when it did not run)."""
        return dict(self.seconds).get(stage, 0.0)

    @property
    def other(self) -> float:
        """Seconds of the planning outside every stage (the budget, the schedule's lowering, bookkeeping)."""
        return max(0.0, self.total - sum(seconds for _, seconds in self.seconds))

    def __str__(self) -> str:
        stages = ", ".join(f"{stage.value} {seconds:.1f} s" for stage, seconds in self.seconds)
        captures = "1 capture" if self.captures == 1 else f"{self.captures} captures"
        return f"{self.total:.1f} s ({captures}): {stages}, other {self.other:.1f} s"


@dataclass
class _Recorder:
    seconds: dict[Stage, float]
    captures: int = 0


_RECORDER: ContextVar[_Recorder | None] = ContextVar("checkmate_stage_times", default=None)


@contextmanager
def recording() -> Iterator[Callable[[], StageTimes]]:
    """Record the stages timed inside the block; the function yielded gives what was recorded so far."""
    recorder = _Recorder({})
    started = time.perf_counter()
    token = _RECORDER.set(recorder)

    def times() -> StageTimes:
        ordered = tuple((stage, recorder.seconds[stage]) for stage in Stage if stage in recorder.seconds)
        return StageTimes(ordered, recorder.captures, time.perf_counter() - started)

    try:
        yield times
    finally:
        _RECORDER.reset(token)


@contextmanager
def timed(stage: Stage) -> Iterator[None]:
    """Add the block's seconds to `stage` in the recording this runs inside (none: nothing is recorded). A stage
    timed inside another is counted in the inner one only."""
    recorder = _RECORDER.get()
    if recorder is None:
        yield
        return
    started = time.perf_counter()
    inner_before = sum(recorder.seconds.values())
    try:
        yield
    finally:
        inner = sum(recorder.seconds.values()) - inner_before
        own = time.perf_counter() - started - inner
        recorder.seconds[stage] = recorder.seconds.get(stage, 0.0) + own


def count_capture() -> None:
    """Count one more capture planned in the recording this runs inside."""
    recorder = _RECORDER.get()
    if recorder is not None:
        recorder.captures += 1
