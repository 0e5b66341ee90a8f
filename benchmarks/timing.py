"""Step times measured alike in every benchmark: calls interleaved round by round, medians of what each took.

Each round calls every function once, so that drift on a shared machine (another job starting, the clock slowing)
hits every configuration alike; the first rounds warm up (caches, lazy initialization) and are not timed.
"""

from __future__ import annotations

import random
import statistics
import time
from collections.abc import Callable, Sequence


def interleaved_times(
    functions: Sequence[Callable[[], object]],
    repeats: int,
    *,
    warmup_rounds: int = 1,
    shuffler: random.Random | None = None,
    before_each: Callable[[int], object] | None = None,
) -> list[list[float]]:
    """Seconds of each of `functions` over `repeats` timed rounds, after `warmup_rounds` untimed ones.

    Each round calls every function once, in index order or, with `shuffler`, in an order it shuffles anew each round
    (warm-up rounds included). `before_each(index)` runs untimed before each call (reset gradients, synchronize a
    device, wait at a barrier)."""
    times: list[list[float]] = [[] for _ in functions]
    for round_index in range(warmup_rounds + repeats):
        order = list(range(len(functions)))
        if shuffler is not None:
            shuffler.shuffle(order)
        for index in order:
            if before_each is not None:
                before_each(index)
            started = time.perf_counter()
            functions[index]()
            if round_index >= warmup_rounds:
                times[index].append(time.perf_counter() - started)
    return times


def interleaved_medians(
    functions: Sequence[Callable[[], object]],
    repeats: int,
    *,
    warmup_rounds: int = 1,
    shuffler: random.Random | None = None,
    before_each: Callable[[int], object] | None = None,
) -> list[float]:
    """The median seconds of each of `functions`, timed by `interleaved_times` with the same arguments."""
    times = interleaved_times(
        functions, repeats, warmup_rounds=warmup_rounds, shuffler=shuffler, before_each=before_each
    )
    return [statistics.median(seconds) for seconds in times]
