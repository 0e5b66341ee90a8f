"""The CPU allocator's own account of memory, read from the profiler's allocation events.

Every CPU tensor allocation, whether made by an eager op, inside a kernel, or by Inductor-generated code
(`empty_strided_cpu`), goes through c10's CPU allocator, which reports it to `torch.profiler` when memory profiling is
on; each allocation and free event carries the allocator's running total. The profiling pass reads each op's scratch
from these events (`checkmate.torch_capture.profile`), and the benchmarks measure whole steps with `allocator_peak`.

The allocator counts a free in that running total only on a thread the profiler records, unless c10's flag
`caffe2_report_cpu_memory_usage` is set (`ProfiledCPUMemoryReporter::Delete`, c10/core/CPUAllocator.cpp, torch 2.13):
a block made on the profiled thread and let go by another (a gloo worker thread dropping the last reference to a
finished collective's buffers) would stay in the total for the rest of the session, and read as held. Each session
sets that flag (`_every_thread_counted`), so every thread's frees and allocations are in the total the events carry,
and restores it after; where the flag cannot be set (a build that does not export it, or c10 logging at INFO, where
the flag also logs every allocation), the session runs without it and says so once.

Every session goes through `memory_profile`. PyTorch's profiler library (Kineto) writes a `USDT: ... profiler_start`
and a `... profiler_stop` line to the process's stderr at each session's start and stop, at every log level that
still shows its errors; `memory_profile` drops those two lines and passes anything else written then through.
"""

from __future__ import annotations

import ctypes
import functools
import logging
import os
import re
import sys
import tempfile
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch
from torch.profiler import ProfilerActivity, profile

log = logging.getLogger(__name__)

# Kineto's marker of a session's start or stop (`USDT_EMIT_START_TRACE` in libkineto's Logger.h).
_SESSION_MARKER = re.compile(rb"^USDT:.*\] profiler_(start|stop)$")


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
    with memory_profile() as profiler:
        run()
    return peak_above_start(profiler)


@contextmanager
def memory_profile() -> Iterator[profile]:
    """A CPU profiler session that records allocations (read them with `allocation_events`), without Kineto's
    start and stop markers on stderr."""
    session = profile(activities=[ProfilerActivity.CPU], profile_memory=True)
    with _every_thread_counted():
        with _without_session_markers():
            session.__enter__()
        try:
            yield session
        finally:
            with _without_session_markers():
                session.__exit__(None, None, None)


@contextmanager
def _every_thread_counted() -> Iterator[None]:
    """c10's flag `caffe2_report_cpu_memory_usage` set inside, so the allocator's running total counts the frees and
    allocations of every thread (module doc); as it was after."""
    flag = _report_flag()
    if flag is None:
        yield
        return
    before = flag.value
    flag.value = True
    try:
        yield
    finally:
        flag.value = before


# c10's log levels (`FLAGS_caffe2_log_level`, c10/util/Logging.h): 0 is INFO, which would print every allocation.
_INFO = 0


@functools.cache
def _report_flag() -> ctypes.c_bool | None:
    """c10's `FLAGS_caffe2_report_cpu_memory_usage` in the loaded libc10, or None (logged once) where it is not
    exported or c10 logs at INFO."""
    libraries = sorted((Path(torch.__file__).parent / "lib").glob("*c10.*"))
    try:
        library = ctypes.CDLL(str(libraries[0]))
        flag = ctypes.c_bool.in_dll(library, "FLAGS_caffe2_report_cpu_memory_usage")
        level = ctypes.c_int.in_dll(library, "FLAGS_caffe2_log_level").value
    except (IndexError, OSError, ValueError) as error:
        log.warning(
            "the CPU allocator meter counts frees only on the profiled thread here (%s): memory another thread lets "
            "go of reads as held",
            error,
        )
        return None
    if level <= _INFO:
        log.warning(
            "c10 logs at INFO: the CPU allocator meter counts frees only on the profiled thread (memory another "
            "thread lets go of reads as held), since counting them would log every allocation"
        )
        return None
    return flag


@contextmanager
def _without_session_markers() -> Iterator[None]:
    """Collect what is written to file descriptor 2 inside, and write it back without Kineto's session markers."""
    sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile() as collected:
        os.dup2(collected.fileno(), 2)
        try:
            yield
        finally:
            sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)
            collected.seek(0)
            lines = collected.read().splitlines(keepends=True)
            kept = [line for line in lines if not _SESSION_MARKER.match(line.rstrip())]
            if kept:
                os.write(2, b"".join(kept))


def event_tree(profiler: profile) -> Sequence[Any]:
    """The roots of a finished profiler session's event tree (walk them with `walk`)."""
    assert profiler.profiler is not None and profiler.profiler.kineto_results is not None, "the session has not ended"
    return profiler.profiler.kineto_results.experimental_event_tree()


def peak_above_start(profiler: profile) -> int:
    """The most bytes the CPU allocator held during a finished profiler session above what it held at its start."""
    events = allocation_events(event_tree(profiler))
    if not events:
        return 0
    _, size, total = events[0]
    return max(total for _, _, total in events) - (total - size)
