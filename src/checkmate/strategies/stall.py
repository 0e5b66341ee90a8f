"""When a search has stopped paying: the MILP's gap between its best plan and its bound has not closed for a while.

On real graphs the MILP often finds nothing better than its warm start and proves no better bound for minutes, a gap
of a few percent left open until the time limit (BENCHMARKS.md, "Compile time"). `optimal`'s `stall_time` stops it
there: after `stall_time` seconds in which the gap (best cost − bound) has not shrunk by STALL_PROGRESS of itself,
the search returns its best plan, with the gap it has (the plan's `gap` says how far from the bound it may be).
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from checkmate.progress import SearchControl

# The gap must shrink by this fraction of itself to count as progress.
STALL_PROGRESS = 0.01


@dataclass
class StallWatch:
    """Polled while a solve runs (mutable: it remembers when the gap last closed).

    Attributes:
        control: the search whose best cost and bound are watched.
        stall_time: seconds without progress after which the search has stalled; None: never.
    """

    control: SearchControl
    stall_time: float | None
    _since: float = 0.0
    _gap: float | None = None

    def stalled(self) -> bool:
        """True once `stall_time` seconds passed since the gap first had a plan, or since it last closed by
        STALL_PROGRESS of itself; never before a plan and a bound are both known (an unbounded gap counts as
        closing)."""
        best, bound = self.control.best_cost, self.control.bound
        if self.stall_time is None or best is None:
            return False
        now = time.perf_counter()
        gap = best - bound if bound is not None else float("inf")
        if self._gap is None or gap <= (1.0 - STALL_PROGRESS) * self._gap:
            self._gap, self._since = gap, now
        return now - self._since >= self.stall_time
