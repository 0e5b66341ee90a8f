"""The choices a user makes, as types: each choice is a `Literal`, its values listed once, and checked in one place
(`check_choice` raises InvalidArgument naming the values a choice may take)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal, get_args

from checkmate.byte_sizes import parse_bytes
from checkmate.errors import InvalidArgument
from checkmate.moved import LinkSpeeds

CostModel = Literal["profile", "flops", "unit"]
"""How capture prices ops: measured time ("profile"), FLOPs, or one unit each."""

FakeCostModel = Literal["flops", "unit"]
"""The cost models that price a step on fake tensors (`checkmate.max_batch`): "profile" runs ops on real ones."""

BackendCostModel = Literal["profile", "flops"]
"""How `checkmate.backend` prices a region's nodes: its compiled functions' measured time, or FLOPs."""

GradientMemory = Literal["whole_step", "when_made"]
"""When gradients count in the plan: held all through the step, or from the op that makes each."""

MeasureMemory = Literal["first", "every", "never"]
"""Which calls of a compiled step measure the live-tensor peak."""

ExecutorName = Literal["eager", "inductor"]
"""What runs a plan's schedule: ATen ops one by one, or Inductor-compiled functions (`checkmate.executors`)."""


SolverName = Literal["highs", "scip", "gurobi", "portfolio"]
"""A MILP backend of `checkmate.milp.backends` (installed or not)."""

SolverChoice = Literal["auto", "highs", "scip", "gurobi", "portfolio"]
"""The `backend` option of the searches: a `SolverName`, or "auto" (`checkmate.milp.backends.policy` picks)."""


def choices(kind: Any) -> tuple[str, ...]:
    """The values of a `Literal` choice, in order."""
    return tuple(get_args(kind))


def check_choice(name: str, value: object, kind: Any) -> None:
    """Raise InvalidArgument unless `value` is one of the values of the `Literal` `kind`; `name` is the argument's."""
    allowed = choices(kind)
    if value not in allowed:
        raise InvalidArgument(f"{name} must be one of {allowed}, got {value!r}")


@dataclass(frozen=True)
class ShardedOptions:
    """How a step of a model sharded with FSDP2 places its units' calls (`checkmate.sharded`).

    Attributes:
        hold_gathered: let the plan keep a unit gathered from its forward to its backward where that pays, instead of
            freeing it and gathering it again as FSDP2's `reshard_after_forward` says (`checkmate.fetched`).
        prefetch_gathers: start each all-gather a stage before the plan needs the unit (where the plan places it and
            counts its buffer), as FSDP2's implicit prefetching starts the next unit's early.
        overlap_gathers: price a prefetched all-gather as hidden behind the compute of the stage before it by the
            fraction measured at the first compile (`checkmate.sharded.link.gather_overlap`); off, every gather counts
            in full.
    """

    hold_gathered: bool = True
    prefetch_gathers: bool = True
    overlap_gathers: bool = True


@dataclass(frozen=True)
class HostOffload:
    """Moves to host memory, allowed beside recomputation (`checkmate.moved`).

    Attributes:
        budget: the most bytes the moved values may take in host memory (None: no limit).
        speeds: the link to host memory (None: measured on the device at the first compile and cached,
            `checkmate.execute.host_link`).
    """

    budget: int | None = None
    speeds: LinkSpeeds | None = None


def host_offload(host_budget: int | str | None, host_link: LinkSpeeds | None) -> HostOffload | None:
    """The moves to host memory that `host_budget` and `host_link` allow (None: none), as `checkmate.compile` and
    `checkmate.backend` take them."""
    if host_budget is None and host_link is None:
        return None
    if host_link is not None and not isinstance(host_link, LinkSpeeds):
        raise InvalidArgument(f"host_link must be a checkmate.LinkSpeeds, got {type(host_link).__name__}")
    if host_budget is None:
        return HostOffload(None, host_link)
    try:
        budget = parse_bytes(host_budget)
    except ValueError as error:
        raise InvalidArgument(f"cannot read host_budget={host_budget!r} as bytes: {error}") from None
    if budget < 0 or isinstance(host_budget, float):
        raise InvalidArgument(f"host_budget must be a byte count >= 0 such as '64GiB', got {host_budget!r}")
    return HostOffload(budget, host_link)
