"""Timing what moves data beside compute (FSDP2's all-gathers, copies to host memory), in the graph's cost unit.

The links a plan prices are measured at the first compile on the device and kept in the profile cache
(`profiles/link-<device>.json` under `checkmate.disk_cache.cache_root`, `cache_file`), as op timings are. A time
becomes a cost as capture priced the graph's ops (`in_cost_unit`): seconds under the "profile" cost model, FLOPs at
the device's matrix-product throughput (measured here) under "flops".
"""

from __future__ import annotations

import functools
import statistics
import time
from collections.abc import Callable
from pathlib import Path

import torch

from checkmate.options import CostModel
from checkmate.torch_capture.profile import cache_directory, device_key

TIMINGS = 5  # timed calls per figure, after one untimed that pays for buffers
THROUGHPUT_SIZE = 256  # the side of the square matrices whose product prices a second in FLOPs


def median_time(
    call: Callable[[], object],
    device: torch.device,
    after: Callable[[], object] | None = None,
    before: Callable[[], object] | None = None,
) -> float:
    """The median time of `TIMINGS` calls of `call`, after one untimed; `before` and `after` run before and after
    each, untimed."""
    took = []
    for _ in range(TIMINGS + 1):
        if before is not None:
            before()
        synchronize(device)
        started = time.perf_counter()
        call()
        synchronize(device)
        took.append(time.perf_counter() - started)
        if after is not None:
            after()
    return statistics.median(took[1:])


def matrices(device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """Two random square matrices of side `THROUGHPUT_SIZE` on `device`: the products that time compute."""
    return torch.randn(THROUGHPUT_SIZE, THROUGHPUT_SIZE, device=device), torch.randn(
        THROUGHPUT_SIZE, THROUGHPUT_SIZE, device=device
    )


def overlap_fraction(
    seconds: float,
    start: Callable[[], object],
    finish: Callable[[object], object],
    device: torch.device,
    after: Callable[[], object] | None = None,
) -> float:
    """The fraction of a transfer of `seconds` that runs beside compute, in [0, 1]: the transfer started (`start()`,
    whose result `finish` then waits for) while matrix products of about its time run, against the two apart (the
    median of `TIMINGS`); what the two together save, as a fraction of the shorter. `after` runs after each timed
    pair, untimed (to undo the transfer)."""
    left, right = matrices(device)
    product = median_time(lambda: torch.mm(left, right), device)
    count = max(1, round(seconds / product)) if product > 0 else 1
    compute = median_time(lambda: [torch.mm(left, right) for _ in range(count)], device)

    def both() -> None:
        handle = start()
        for _ in range(count):
            torch.mm(left, right)
        finish(handle)

    together = median_time(both, device, after=after)
    shorter = min(seconds, compute)
    return float(min(1.0, max(0.0, (seconds + compute - together) / shorter))) if shorter > 0 else 0.0


@functools.cache
def flops_per_second(device: torch.device) -> float:
    """The device's matrix-product throughput, measured once per process: what a second costs in a graph priced in
    FLOPs. Once: every plan of a step prices its links at the same rate, and a step planning a new state (a mode
    switch, a new shape) measures nothing while it runs."""
    left, right = matrices(device)
    return 2 * THROUGHPUT_SIZE**3 / median_time(lambda: torch.mm(left, right), device)


def in_cost_unit(seconds: tuple[float, ...], cost_model: CostModel, device: torch.device) -> tuple[float, ...]:
    """Times in the graph's cost unit: seconds as they are ("profile"), FLOPs at the device's matrix-product
    throughput, measured here ("flops"), nothing for the "unit" model (every node costs 1, a test model)."""
    if cost_model == "profile":
        return seconds
    if cost_model == "unit":
        return (0.0,) * len(seconds)
    rate = flops_per_second(device)
    return tuple(rate * each for each in seconds)


def synchronize(device: torch.device) -> None:
    """Wait for the device's queued work (CUDA)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def cache_file(device: torch.device) -> Path:
    """The link timings' cache file for `device`."""
    return cache_directory() / f"link-{device_key(device)}.json"
