"""The process group's collectives as a plan prices them: each unit's gather and reduce-scatter timed on the group,
cached on disk.

A sharded plan prices each fetch of a unit's parameters at the time its all-gather takes (FSDP2's `unshard`, which
on CPU ranks is mostly FSDP2's copies in and out of its flat buffer), each unit's release at the time its reduce takes
(FSDP2's post-backward: the copy of its gradients into the reduce-scatter buffer, the collective, the division and
the sharded `.grad`s, `reduce_seconds`), and, when asked, the fraction of a prefetched all-gather that runs beside
compute. All are measured on the process group at the first compile (`measure_link`) and kept in the profile cache
(`checkmate.torch_capture.link_timing.cache_file`), keyed by the process group's backend and size and by the unit's
parameters (shapes and dtypes), as op timings are kept: the next compile of the same model on the same machine reuses
them. Units of the same parameter shapes (a model's blocks) get one figure, the median of their timings.

Measuring is a collective call (every rank gathers the units in the same order), so the ranks first agree whether
all of them have every timing cached (`dist.all_reduce` of a flag); if any lacks one, every rank measures again.
"""

from __future__ import annotations

import functools
import hashlib
import logging
import statistics
from collections.abc import Sequence
from dataclasses import dataclass

import torch
import torch.distributed as dist

import checkmate.sharded.fsdp2 as fsdp2
from checkmate.json_cache import finite_number, merge_entries, read_entries
from checkmate.sharded.units import Unit
from checkmate.torch_capture.link_timing import cache_file, median_time, overlap_fraction

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Link:
    """The process group as the plan prices it.

    Attributes:
        seconds: per unit, one all-gather of its parameters.
        reduce_seconds: per unit, one reduce-scatter of its gradients (0 for a unit without any).
        overlap: the fraction of a prefetched all-gather that runs beside compute (0 when not measured).
        cached: whether the figures came from the cache (no collective was timed).
    """

    seconds: tuple[float, ...]
    reduce_seconds: tuple[float, ...]
    overlap: float
    cached: bool


def measure_link(units: Sequence[Unit], overlap: bool) -> Link:
    """Each unit's all-gather and reduce-scatter times and, with `overlap`, the fraction of a gather that runs beside
    compute: from the cache when every rank has them, else timed on the process group (`gather_seconds`,
    `reduce_seconds`, `gather_overlap`) and stored. A collective call: every rank of the units' process group makes
    it."""
    path = cache_file(fsdp2.device(units[0].group))
    identities = [_unit_key(unit) for unit in units]
    keys = [f"gather|{identity}" for identity in identities]
    reduce_keys = [f"post_backward|{identity}" for identity in identities]
    overlap_key = f"overlap|{_unit_key(_largest(units))}"
    cache = read_entries(path, finite_number)
    wanted = [*keys, *reduce_keys, *([overlap_key] if overlap else [])]
    if _everywhere(all(key in cache for key in wanted), units[0]):
        return Link(
            tuple(float(cache[key]) for key in keys),
            tuple(float(cache[key]) for key in reduce_keys),
            float(cache[overlap_key]) if overlap else 0.0,
            True,
        )
    gathers = _typical(keys, gather_seconds(units))
    reduces = _typical(reduce_keys, reduce_seconds(units))
    seconds = tuple(gathers[key] for key in keys)
    fraction = gather_overlap(units, seconds) if overlap else 0.0
    merge_entries(path, gathers | reduces | ({overlap_key: fraction} if overlap else {}), finite_number)
    return Link(seconds, tuple(reduces[key] for key in reduce_keys), fraction, False)


def _typical(keys: Sequence[str], measured: Sequence[float]) -> dict[str, float]:
    """One figure per key: the median of the timings of the units that share it (units of the same shapes)."""
    by_key: dict[str, list[float]] = {}
    for key, took in zip(keys, measured, strict=True):
        by_key.setdefault(key, []).append(took)
    return {key: statistics.median(times) for key, times in by_key.items()}


def _unit_key(unit: Unit) -> str:
    """The unit's identity for the cache: the process group's backend and size, and its parameters' shapes and
    dtypes (what its all-gather moves and copies)."""
    group = fsdp2.shard_process_group(unit.group)
    parameters = [
        (tuple(shard.shape), str(shard.dtype)) for shard in map(fsdp2.sharded_parameter, fsdp2.params(unit.group))
    ]
    text = f"{dist.get_backend(group)}|{dist.get_world_size(group)}|{parameters}"
    return hashlib.sha1(text.encode()).hexdigest()


def _everywhere(flag: bool, unit: Unit) -> bool:
    """Whether `flag` holds on every rank of the unit's process group (a collective call)."""
    agreed = torch.tensor([int(flag)], device=fsdp2.device(unit.group))
    dist.all_reduce(agreed, op=dist.ReduceOp.MIN, group=fsdp2.shard_process_group(unit.group))
    return bool(agreed.item())


def _largest(units: Sequence[Unit]) -> Unit:
    return max(units, key=lambda unit: unit.shard_bytes)


def gather_seconds(units: Sequence[Unit]) -> tuple[float, ...]:
    """Each unit's all-gather (FSDP2's `unshard`), timed on this rank: the median of `TIMINGS`, after one
    untimed. A collective call: every rank gathers the units in the same order."""
    device = fsdp2.device(units[0].group)
    return tuple(median_time(unit.module.unshard, device, after=unit.module.reshard) for unit in units)


def reduce_seconds(units: Sequence[Unit]) -> tuple[float, ...]:
    """Each unit's reduce as the step's REDUCE runs it (FSDP2's post-backward: its gradients copied into the
    reduce-scatter buffer, the collective, the division, this rank's shards made the sharded `.grad`s, the gathered
    parameters freed), timed on this rank as `gather_seconds` times a gather, on the unit gathered with zero gradients;
    every sharded `.grad` is as it was after. 0 for a unit without gradients. A collective call: every rank reduces
    the units in the same order."""
    device = fsdp2.device(units[0].group)
    took = []
    for unit in units:
        made = unit.params_with_gradients
        if not made:
            took.append(0.0)
            continue
        kept = [fsdp2.sharded_parameter(param).grad for param in made]
        took.append(
            median_time(
                functools.partial(fsdp2.post_backward, unit.group),
                device,
                before=functools.partial(_with_zero_gradients, unit, made),
            )
        )
        for param, grad in zip(made, kept, strict=True):
            fsdp2.sharded_parameter(param).grad = grad
        fsdp2.finish_backward([(unit.module, unit.group)])
        unit.module.reshard()  # as it was, where FSDP2 keeps a unit gathered after its backward
    return tuple(took)


def _with_zero_gradients(unit: Unit, made: Sequence[fsdp2.Param]) -> None:
    """The unit gathered, each of `made` with a zero gradient on its full parameter and none on its shard: what the
    unit's post-backward finds in a step that starts with no `.grad`s."""
    unit.module.unshard()
    for param in made:
        fsdp2.sharded_parameter(param).grad = None
        full = fsdp2.unsharded_parameter(param)
        full.grad = torch.zeros_like(full)


def gather_overlap(units: Sequence[Unit], seconds: Sequence[float]) -> float:
    """The fraction of an all-gather that runs beside compute on this rank, in [0, 1]: the largest unit's gather
    started early (FSDP2's `unshard(async_op=True)`, as a prefetch) while matrix products of about its time run,
    against the two apart (the median of `TIMINGS`). A collective call, like `gather_seconds`."""
    largest = units.index(_largest(units))
    module = units[largest].module

    def wait(handle: object) -> None:
        if handle is not None:
            handle.wait()  # type: ignore[attr-defined]

    return overlap_fraction(
        seconds[largest],
        lambda: module.unshard(async_op=True),
        wait,
        fsdp2.device(units[largest].group),
        after=module.reshard,
    )
