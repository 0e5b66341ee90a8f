"""Work that every rank of a process group must finish together, such as compiling a distributed step.

A data-parallel or sharded `checkmate.compile` plans on every rank and then agrees across ranks (buckets, a plan)
with collectives. A rank whose planning fails would never reach those collectives, and the others would wait in them
until the process group's timeout (10 or 30 minutes by default). `on_every_rank` runs the local work, then
all-reduces one flag per rank: every rank learns at once which ranks failed. A failed rank raises its own error; the
others raise RankFailed naming it.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any, TypeVar

import torch
import torch.distributed as dist

from checkmate.errors import RankFailed

log = logging.getLogger(__name__)

Result = TypeVar("Result")


def on_every_rank(work: Callable[[], Result], group: Any, device: torch.device, *, what: str) -> Result:
    """Run `work` on this rank, and return its result once every rank of `group` has run its own without error.

    A collective call: every rank of `group` must make it. The flags travel on `device` (the parameters' device,
    which NCCL needs).

    Raises:
        RankFailed: `work` raised on another rank (that rank raises its own error).
        Exception: what `work` raised on this rank, once the other ranks have been told.
    """
    world_size = dist.get_world_size(group)
    failed = torch.zeros(world_size, dtype=torch.int32, device=device)
    rank = dist.get_rank(group)
    try:
        result = work()
    except Exception:
        failed[rank] = 1
        dist.all_reduce(failed, group=group)
        raise
    dist.all_reduce(failed, group=group)
    ranks = [int(index) for index in torch.nonzero(failed.cpu()).flatten()]
    if ranks:
        global_ranks = [dist.get_global_rank(group, index) for index in ranks] if group is not None else ranks
        log.error("%s failed on rank(s) %s", what, global_ranks)
        raise RankFailed(
            f"{what} failed on rank(s) {global_ranks} of the process group (see the error raised there); this rank "
            f"({dist.get_rank()}) stops too, so that no rank waits in a collective the others never reach"
        )
    return result
