"""What passing a value through memory costs on the device: the time to clone a tensor of each size.

Inductor computes a fused chain of pointwise ops inside one loop: a value made and read in the same kernel is never
written to memory. So a recomputation run inside the kernel of the op that reads it saves what keeping the value
costs: allocating it, writing it and reading it back, which is what a clone does. The clone is timed once per device
at sizes from 64 KiB to 64 MiB (on CPU a fresh allocation's page faults and the caches make the rate per byte vary
tenfold over that range) and read at a value's size by linear interpolation; beyond the largest size it grows in
proportion. The figures are cached on disk beside the node measures (`checkmate.inductor.measure`).
"""

from __future__ import annotations

import bisect
import logging
import statistics
import time
from dataclasses import dataclass

import torch

from checkmate.execute.memory import synchronize
from checkmate.json_cache import finite_number, merge_entries, read_entries
from checkmate.torch_capture.profile import cache_directory, device_key

log = logging.getLogger(__name__)

SIZES = tuple(4**power for power in range(8, 14))  # 64 KiB .. 64 MiB
REPEATS = 7


@dataclass(frozen=True)
class MemoryTraffic:
    """Measured clone times: `seconds[k]` for a tensor of `sizes[k]` bytes (sizes increasing)."""

    sizes: tuple[int, ...]
    seconds: tuple[float, ...]

    def cost(self, nbytes: int) -> float:
        """Seconds to allocate, write and read back a value of `nbytes` bytes."""
        if nbytes <= 0:
            return 0.0
        if nbytes >= self.sizes[-1]:
            return self.seconds[-1] * nbytes / self.sizes[-1]
        upper = bisect.bisect_right(self.sizes, nbytes)
        if upper == 0:
            return self.seconds[0] * nbytes / self.sizes[0]
        low, high = self.sizes[upper - 1], self.sizes[upper]
        share = (nbytes - low) / (high - low)
        return self.seconds[upper - 1] + share * (self.seconds[upper] - self.seconds[upper - 1])


def memory_traffic(device: torch.device) -> MemoryTraffic:
    """The device's clone times (at the current thread count), from the cache or measured now."""
    path = cache_directory() / f"inductor-traffic-{device_key(device, torch.get_num_threads())}.json"
    cached = read_entries(path, finite_number)
    if all(str(size) in cached for size in SIZES):
        return MemoryTraffic(SIZES, tuple(float(cached[str(size)]) for size in SIZES))
    started = time.perf_counter()
    seconds = tuple(_clone_seconds(size, device) for size in SIZES)
    log.info("Inductor: measured the memory traffic of %d sizes in %.1f s", len(SIZES), time.perf_counter() - started)
    merge_entries(path, {str(size): value for size, value in zip(SIZES, seconds, strict=True)}, finite_number)
    return MemoryTraffic(SIZES, seconds)


def _clone_seconds(nbytes: int, device: torch.device) -> float:
    source = torch.ones(nbytes, dtype=torch.uint8, device=device)
    times = []
    for _ in range(REPEATS):
        synchronize(device)
        started = time.perf_counter()
        copy = source.clone()
        synchronize(device)
        times.append(time.perf_counter() - started)
        del copy
    return statistics.median(times)
