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
from checkmate.fetched import FetchedValue
from checkmate.options import GradientMemory
from checkmate.sharded.memory import UnitBytes, gather_workspaces
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


def unit_fetches(
    use: UnitUse,
    sizes: UnitBytes,
    stages: int,
    fetch_costs: Sequence[float],
    release_costs: Sequence[float],
    *,
    released_before_backward: bool,
) -> tuple[FetchedValue, ...]:
    """Each unit's gathered parameters as a fetched value of the plan's graph (`checkmate.fetched`): read by the
    nodes that read its parameters, last used by the last node that makes one of its gradients (its REDUCE
    follows), its backward from the stage after the loss's, kept where FSDP2 does not reshard it after the forward,
    released before the backward when the step must not hold it (`ShardedOptions.hold_gathered` off), each fetch at
    `fetch_costs` (the graph's cost unit) with its gather's buffers as its workspaces
    (`checkmate.sharded.memory.gather_workspaces`), and released at `release_costs` (its reduce-scatter) where it has
    gradients. A unit the step does not use is present in the last stage only."""
    values = []
    gathering, in_flight = gather_workspaces(sizes)
    for unit, (memory, cost, release) in enumerate(zip(sizes.parameters, fetch_costs, release_costs, strict=True)):
        readers = tuple(node for node, units in enumerate(use.reads) if unit in units)
        makers = [node for node, units in enumerate(use.gradients) if unit in units]
        last_use = max([*readers, *makers], default=stages - 1)
        kept = not use.reshard_after_forward[unit]
        values.append(
            FetchedValue(
                name=f"unit {unit}",
                memory=memory,
                readers=readers,
                fetch_cost=cost,
                last_use=last_use,
                backward_start=use.last_forward_stage + 1,
                kept=kept,
                released_before_backward=released_before_backward and not kept and bool(readers),
                fetch_workspace=int(gathering[unit]),
                in_flight_workspace=int(in_flight[unit]),
                release_cost=release if makers else 0.0,
            )
        )
    return tuple(values)


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
