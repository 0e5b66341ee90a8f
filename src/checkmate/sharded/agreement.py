"""One plan on every rank of a sharded step: rank 0's, after checking that every rank captured the same step.

The gathers and reduce-scatters of a sharded step sit among the steps of its schedule
(`checkmate.sharded.timeline`), so every rank must run the same schedule, or the collectives would not match. Each
rank captures and profiles its step; rank 0 alone searches for a plan (`checkmate.sharded.planning`: the other ranks
leave it the machine's cores, and a search that finds nothing on one rank cannot fail a plan another found), which
is then broadcast and run everywhere. The captured steps must match node for node: the same model and the same
batch shape on every rank (uneven inputs are refused).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
from typing import Any

import torch.distributed as dist

from checkmate.captured import Captured
from checkmate.errors import ShardedTrainingError
from checkmate.plan import schedule_of
from checkmate.training.planning import Compiled

log = logging.getLogger(__name__)


def agree_on_plan(compiled: Compiled, group: Any) -> Compiled:
    """`compiled` with rank 0's plan and schedule. A collective call: every rank of `group` must make it.

    Raises:
        ShardedTrainingError: the ranks captured different steps (another batch shape or model on some rank); every
            rank raises it.
    """
    structures: list[Any] = [None] * dist.get_world_size(group)
    dist.all_gather_object(structures, structure_of(compiled.captured), group=group)
    differing = [rank for rank, structure in enumerate(structures) if structure != structures[0]]
    if differing:
        raise ShardedTrainingError(
            f"ranks {differing} of the process group captured another step than rank 0 (uneven inputs: another "
            "batch shape, or another model): a sharded step runs one plan on every rank, so give every rank a "
            "batch of the same shapes and dtypes"
        )
    box: list[Any] = [compiled.plan]
    dist.broadcast_object_list(box, src=dist.get_global_rank(group, 0), group=group)
    if dist.get_rank(group) == 0:
        return compiled
    plan = box[0]
    log.info("running rank 0's plan (predicted cost %.6g, peak %d bytes)", plan.cost, plan.peak_memory)
    return dataclasses.replace(compiled, plan=plan, schedule=schedule_of(compiled.captured.graph, plan))


def structure_of(captured: Captured) -> str:
    """A digest of what must match across ranks: the graph's nodes and edges, what each evaluates, and the step's
    parameters and batch shapes (not the costs or scratch bytes, which profiling measures per rank)."""
    document = {
        "nodes": [(node.name, node.inputs, node.memory, node.backward) for node in captured.graph.nodes],
        "members": captured.members,
        "parameters": captured.parameter_names,
        "batch": captured.batch_shapes,
    }
    return hashlib.sha256(json.dumps(document, default=str).encode()).hexdigest()
