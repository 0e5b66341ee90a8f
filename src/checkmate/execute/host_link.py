"""The link to host memory as the step's copies run on it: bandwidth each way, latency per copy, and the fraction of
a copy that runs beside compute, measured on the device with the step's own copier (`checkmate.execute.host_copies`)
at first use and kept in the profile cache (`checkmate.torch_capture.link_timing.cache_file`).

Each direction is timed at two sizes (`SMALL_BYTES` and the device's large size), each the median of
`link_timing.TIMINGS` copies after one untimed that makes the host copy; the latency and the cost per byte are the
line through the two. The overlap is measured as the sharded link's is (`link_timing.overlap_fraction`): matrix
products of about a large copy's time, alone and with that copy out running beside them.
"""

from __future__ import annotations

import logging

import torch

from checkmate.execute.host_copies import HostCopier
from checkmate.json_cache import finite_number, merge_entries, read_entries
from checkmate.moved import LinkSpeeds
from checkmate.torch_capture.link_timing import cache_file, median_time, overlap_fraction
from checkmate.torch_capture.profile import device_key

log = logging.getLogger(__name__)

SMALL_BYTES = 1 << 16
LARGE_BYTES = {"cpu": 1 << 24, "cuda": 1 << 27}
_FIGURES = ("to_host", "to_device", "latency", "overlap")


def measured_link_speeds(device: torch.device) -> LinkSpeeds:
    """The link between `device` and host memory, from the cache when it has it, else measured (module doc) and
    stored."""
    path = cache_file(device)
    keys = {figure: f"host|{figure}|{device_key(device)}" for figure in _FIGURES}
    cache = read_entries(path, finite_number)
    if all(key in cache for key in keys.values()):
        return LinkSpeeds(*(float(cache[keys[figure]]) for figure in _FIGURES))
    speeds = _measure(device)
    log.info(
        "host link of %s: %.3g GB/s to host, %.3g GB/s back, %.3g us per copy, overlap %.2f",
        device,
        speeds.to_host / 1e9,
        speeds.to_device / 1e9,
        speeds.latency * 1e6,
        speeds.overlap,
    )
    merge_entries(path, {keys[figure]: getattr(speeds, figure) for figure in _FIGURES}, finite_number)
    return speeds


def _measure(device: torch.device) -> LinkSpeeds:
    large = LARGE_BYTES.get(device.type, LARGE_BYTES["cpu"])
    copier = HostCopier()
    out_small, in_small = _copy_times(copier, device, SMALL_BYTES)
    out_large, in_large = _copy_times(copier, device, large)
    to_host = _line(SMALL_BYTES, out_small, large, out_large)
    to_device = _line(SMALL_BYTES, in_small, large, in_large)
    latency = max(0.0, min(to_host[0], to_device[0]))
    overlap = _overlap(copier, device, large, out_large)
    return LinkSpeeds(1.0 / to_host[1], 1.0 / to_device[1], latency, overlap)


def _copy_times(copier: HostCopier, device: torch.device, size: int) -> tuple[float, float]:
    """The median seconds of a copy of `size` bytes to host memory, and back."""
    value = torch.ones(size, dtype=torch.uint8, device=device)
    out = median_time(lambda: _copy_out(copier, value), device)
    back = median_time(lambda: copier.end_copy_in(0, _copy_in(copier)), device)
    return out, back


def _copy_out(copier: HostCopier, value: torch.Tensor) -> None:
    copier.copy_out(0, (value,))
    copier.end_copy_out(0)


def _copy_in(copier: HostCopier) -> int:
    copier.copy_in(0, 2)
    return 2


def _line(small: int, small_seconds: float, large: int, large_seconds: float) -> tuple[float, float]:
    """(seconds per copy, seconds per byte) of the line through the two timings; the slope at least a tenth of the
    large copy's average, so that noise never makes a byte free."""
    per_byte = max((large_seconds - small_seconds) / (large - small), 0.1 * large_seconds / large)
    return small_seconds - per_byte * small, per_byte


def _overlap(copier: HostCopier, device: torch.device, size: int, copy_seconds: float) -> float:
    value = torch.ones(size, dtype=torch.uint8, device=device)
    return overlap_fraction(
        copy_seconds, lambda: copier.copy_out(0, (value,)), lambda _: copier.end_copy_out(0), device
    )
