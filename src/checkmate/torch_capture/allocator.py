"""The CPU allocator's own account of memory, read from the profiler's allocation events.

Every CPU tensor allocation, whether made by an eager op, inside a kernel, or by Inductor-generated code
(`empty_strided_cpu`), goes through c10's CPU allocator, which reports it to `torch.profiler` when memory profiling is
on; each allocation and free event carries the allocator's running total. The profiling pass reads each op's scratch
from these events (`checkmate.torch_capture.profile`), and the benchmarks measure whole steps with `allocator_peak`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from typing import Any

import torch
from torch.profiler import ProfilerActivity, profile


def walk(roots: Sequence[Any]) -> Iterator[Any]:
    """Every event of a profiler's event tree (`profiler.profiler.kineto_results.experimental_event_tree()`)."""
    stack = list(roots)
    while stack:
        event = stack.pop()
        yield event
        stack.extend(event.children)


def allocation_events(roots: Sequence[Any]) -> list[tuple[int, int, int]]:
    """(time in ns, bytes allocated (negative: freed), the allocator's running total after it) of every CPU
    allocation and free in the event tree, in time order."""
    return sorted(
        (event.start_time_ns, event.extra_fields.alloc_size, event.extra_fields.total_allocated)
        for event in walk(roots)
        if isinstance(event.extra_fields, torch._C._profiler._ExtraFields_Allocation)
        and event.extra_fields.device.type == "cpu"
    )


def allocator_peak(run: Callable[[], Any]) -> int:
    """Peak bytes allocated through the CPU allocator while `run()` runs, above what was allocated at its start.

    Frees of blocks allocated before profiling started are not reported, so a run that frees memory it did not
    allocate reads high, never low.
    """
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as profiler:
        run()
    return peak_above_start(profiler)


def peak_above_start(profiler: profile) -> int:
    """The most bytes the CPU allocator held during a finished profiler session above what it held at its start."""
    assert profiler.profiler is not None and profiler.profiler.kineto_results is not None, "the session has not ended"
    events = allocation_events(profiler.profiler.kineto_results.experimental_event_tree())
    if not events:
        return 0
    _, size, total = events[0]
    return max(total for _, _, total in events) - (total - size)
