"""Which units a sharded step keeps gathered from their forward to their backward, instead of gathering them again.

FSDP2 frees a unit's gathered parameters after its forward and gathers them again before its backward
(`reshard_after_forward=True`). Holding them instead saves one all-gather per unit and step, and costs the unit's
gathered parameters from the end of its forward to its backward. The plan is made first (`checkmate.sharded.planning`,
the units' calls placed as FSDP2 would); then each unit that FSDP2 would gather twice is held when the sharded peak
(`checkmate.sharded.memory.sharded_peak`) still fits the budget with it, the units whose parameters would be held
for the fewest steps first (the last forward blocks). A hold only takes memory the plan left unused: it never costs a
recomputation, so it needs no price per byte.

A step holding every block runs a little faster than one that gathers them again, at a little more memory per rank
(`benchmarks/investigations/sharded_regather.py`; BENCHMARKS.md, "Investigations").
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Sequence

from checkmate.sharded.memory import UnitBytes, sharded_peak
from checkmate.sharded.timeline import UnitUse, unit_positions
from checkmate.simulate import Schedule, Step

log = logging.getLogger(__name__)


def hold_gathered(schedule: Schedule, use: UnitUse, sizes: UnitBytes, budget: int) -> UnitUse:
    """`use` with `reshard_after_forward` off for each unit held from its forward to its backward (see the module
    doc): units are held while the sharded peak of `schedule` stays within `budget` bytes, tried greedily from the
    shortest hold, and those refused tried again after each pass that held one."""
    waiting = _candidates(schedule.steps, use)
    while waiting:  # a hold can make room for one refused before (no gather again, no transient), so pass again
        refused = []
        for unit in waiting:
            reshard = use.reshard_after_forward
            trial = dataclasses.replace(use, reshard_after_forward=(*reshard[:unit], False, *reshard[unit + 1 :]))
            if sharded_peak(schedule, trial, sizes) <= budget:
                use = trial
            else:
                refused.append(unit)
        if len(refused) == len(waiting):
            break
        waiting = refused
    log.debug("units not freed after their forward: %s", kept_gathered(use))
    return use


def kept_gathered(use: UnitUse) -> tuple[int, ...]:
    """The units whose parameters are not freed after their forward: held, or never freed (FSDP2's root)."""
    return tuple(unit for unit, reshard in enumerate(use.reshard_after_forward) if not reshard)


def _candidates(steps: Sequence[Step], use: UnitUse) -> list[int]:
    """The units FSDP2 frees after their forward and gathers again for their backward, by the number of steps between
    their last forward read (where the free goes) and their first backward read (where the gather goes), fewest
    first."""
    positions = unit_positions(steps, use)
    forward, backward = positions.forward_reads, positions.backward_reads
    twice = [unit for unit in forward if unit in backward and use.reshard_after_forward[unit]]
    return sorted(twice, key=lambda unit: (backward[unit][0] - forward[unit][-1], unit))
