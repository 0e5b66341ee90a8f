"""Where a captured step's parameters live among the FSDP2 units, and the sizes of what each unit holds.

The step is captured on the unsharded model (`checkmate.sharded.planning`), so its placeholders are the units' full
parameters. `captured_units` ties each placeholder to its unit, finds what each graph node does with the units
(`checkmate.sharded.reads`) and sizes what the units hold on this rank (`checkmate.sharded.memory.UnitBytes`).
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Sequence
from dataclasses import dataclass

import torch.distributed as dist
from torch import nn

import checkmate.sharded.fsdp2 as fsdp2
from checkmate.captured import Captured
from checkmate.errors import ShardedTrainingError
from checkmate.options import GradientMemory
from checkmate.sharded.memory import UnitBytes
from checkmate.sharded.reads import unit_use
from checkmate.sharded.timeline import UnitUse
from checkmate.sharded.units import Unit

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class CapturedUnits:
    """A captured step's parameters among the units.

    Attributes:
        parameters: the full parameter of each placeholder, in placeholder order.
        unit_of: the unit of each of them (an index into the model's units).
        use: what each graph node does with the units.
        sizes: what the units hold on this rank.
    """

    parameters: tuple[nn.Parameter, ...]
    unit_of: tuple[int, ...]
    use: UnitUse
    sizes: UnitBytes


def captured_units(
    captured: Captured, units: Sequence[Unit], *, prefetch_gathers: bool, gradient_memory: GradientMemory
) -> CapturedUnits:
    """Where `captured`'s parameters are among `units`; `prefetch_gathers` starts each unit's all-gather early,
    as FSDP2's implicit prefetching does (`checkmate.sharded.timeline`); `gradient_memory` says whether the step
    starts with gradient shards ("whole_step") or makes them at each unit's reduce ("when_made").

    Raises:
        ShardedTrainingError: a captured parameter belongs to no unit (the root is not sharded).
    """
    place = {
        fsdp2.parameter_name(param): (number, param)
        for number, unit in enumerate(units)
        for param in fsdp2.params(unit.group)
    }
    names = captured.parameter_names
    missing = [name for name in names if name not in place]
    if missing:
        raise ShardedTrainingError(
            f"the parameters {missing[:5]} are not sharded by any fully_shard unit: apply fully_shard to the root too"
        )
    unit_of = tuple(place[name][0] for name in names)
    parameters = tuple(fsdp2.unsharded_parameter(place[name][1]) for name in names)
    use = dataclasses.replace(
        unit_use(captured, unit_of, tuple(unit.reshard_after_forward for unit in units)),
        prefetch_gathers=prefetch_gathers,
    )
    sizes = _sizes(captured, units, unit_of, parameters, shards_made_at_reduce=gradient_memory == "when_made")
    return CapturedUnits(parameters, unit_of, use, sizes)


def _sizes(
    captured: Captured,
    units: Sequence[Unit],
    unit_of: Sequence[int],
    parameters: Sequence[nn.Parameter],
    *,
    shards_made_at_reduce: bool,
) -> UnitBytes:
    made: list[dict[int, int]] = [{} for _ in captured.members]
    for index, gradient in enumerate(captured.gradients):
        if gradient is not None:
            node, unit = captured.node_of[gradient], unit_of[index]
            made[node][unit] = made[node].get(unit, 0) + parameters[index].numel() * parameters[index].element_size()
    return UnitBytes(
        parameters=tuple(unit.shard_bytes * unit.world_size for unit in units),
        gradients=tuple(unit.gradient_shard_bytes * unit.world_size for unit in units),
        parameter_shards=tuple(unit.shard_bytes for unit in units),
        gradient_shards=tuple(unit.gradient_shard_bytes for unit in units),
        made=tuple(made),
        fixed_memory=captured.graph.fixed_memory,
        collectives_copy=any(dist.get_backend(fsdp2.shard_process_group(unit.group)) == "gloo" for unit in units),
        shards_made_at_reduce=shards_made_at_reduce,
    )
