"""Sharded training: `checkmate.compile` of a model sharded with FSDP2's `fully_shard` gives eager FSDP2's gradients.

    torch.distributed.init_process_group("gloo")                    # or "nccl"; torchrun sets the environment
    for block in model.blocks:
        fully_shard(block)
    fully_shard(model)
    step = checkmate.compile(model, loss_fn, batch, budget=0.5)     # every rank calls, with batches of one shape
    loss = step(*batch); optimizer.step(); optimizer.zero_grad()

* Capture and plan (`checkmate.sharded.planning`). The step is captured on the unsharded model (every unit gathered
  once at compile time), so the plan's graph is the op graph of a single-process step. Every rank captures; rank 0
  plans, and its plan is broadcast and run on every rank (`checkmate.sharded.agreement`), after checking that every
  rank captured the same step. A rank whose planning fails makes every rank raise at once (`checkmate.training.ranks`).
* Gathers as decisions of the plan. Each unit's gathered parameters are a fetched value of the plan's graph
  (`checkmate.fetched`): the plan decides in which stages a unit is gathered, each gather priced at its all-gather's
  time measured at the first compile and cached (`checkmate.sharded.link`), so holding a unit from its forward to
  its backward, freeing it and gathering it again, or recomputing instead, are weighed in one search; with
  prefetching, where each gather starts (the stage before the plan makes the unit present) and so the prefetches'
  order and depth are the plan's too, their buffers counted in its memory.
  `reshard_after_forward=False` (FSDP2's root) keeps a unit gathered from its first read to its reduce;
  `ShardedOptions(hold_gathered=False)` frees every other unit between its forward and its backward, as FSDP2 does.
* Running (`checkmate.sharded.timeline`). The plan's schedule runs with a unit's all-gather before the first step that
  reads its parameters in each run of stages where the plan has it gathered, its free after the last one, and FSDP2's
  post-backward after its last step: the reduce-scatter into the sharded `.grad` with FSDP2's own arithmetic
  (`foreach_reduce`), or with `set_requires_gradient_sync(False)` the local accumulation. The gathers and frees are
  FSDP2's own (`unshard`, `reshard`): the full parameters keep one tensor each, whose storage a gather fills and a free
  empties, so the schedule reads them as plain inputs. Every rank issues the same collectives in the same order. With
  two ranks the sharded `.grad`s equal eager FSDP2's bit for bit (tests/torch/test_sharded.py).
* Memory (`checkmate.sharded.memory`): the budget is this rank's peak. The plan's graph holds this rank's shards of
  the parameters and of their gradients (padded as FSDP2 pads them), the buffers and the batch in its fixed memory,
  and its activations as in a single-process step; with `gradient_memory="when_made"` (the step starts with no
  `.grad`s, as after `optimizer.zero_grad()`), each unit's gradient shards are counted from its reduce-scatter, which
  makes them, instead. Around it the step holds each unit's gathered parameters from its gather to its free, its
  unsharded gradients from the op that makes each to its reduce-scatter, FSDP2's reduce-scatter buffers and, on
  gloo, the collectives' copies; `sharded_peak` counts them at the places the
  schedule puts each unit's calls, and `checkmate.sharded.planning` solves the graph within the budget less what
  they hold (again lower when the sharded peak is still over). `step.report()` gives the sharded figures. On 2 gloo
  ranks the allocator's per-rank peak is at or below the planned one (tests/torch/test_sharded.py). Optimizer state
  is not counted, as in a single-process step.

Each gather of a run of stages that starts in stage s > 0 is prefetched from the start of stage s - 1
(`checkmate.sharded.timeline`). Reduce-scatters
run inside FSDP2's post-backward: on CUDA on its reduce-scatter stream, overlapping the steps after them as in eager
FSDP2; on CPU synchronous, as in eager FSDP2. The units' calls are a schedule pass placed before the
executor's (`UnitCalls`, `checkmate.execute.passes`): with the Inductor executor, fused runs lie between them.
Refused with ShardedTrainingError: CPU offload, mixed precision, HSDP (2-D meshes), tensor-parallel parameters,
all-gather extensions, several parameter groups per unit, a root that is not sharded, and uneven inputs (another
batch shape on some rank). A new batch shape is planned again on every rank together: every rank must meet it in
the same call.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from torch import nn
from torch.distributed.tensor import DTensor

import checkmate.sharded.fsdp2 as fsdp2
from checkmate.byte_sizes import resolve_budget
from checkmate.errors import ShardedTrainingError
from checkmate.execute.codegen import Call
from checkmate.execute.gradients import StepGradients
from checkmate.execute.passes import Lowering, PassOrder, with_steps
from checkmate.fetched import fetches
from checkmate.options import GradientMemory, ShardedOptions
from checkmate.plan import schedule_of
from checkmate.sharded.captured_units import CapturedUnits, captured_units
from checkmate.sharded.gradients import ShardedGradients
from checkmate.sharded.memory import UnitBytes, held_at_computes, sharded_peak
from checkmate.sharded.planning import plan_sharded
from checkmate.sharded.timeline import FREE, GATHER, PREFETCH, REDUCE, UnitCall, place_unit_calls, unit_positions
from checkmate.sharded.units import Unit, check_root, check_supported, initialize, sharding_fixed_memory, units_of
from checkmate.simulate import Schedule
from checkmate.torch_capture.trace import LossFunction
from checkmate.training.compiled import CompiledStep
from checkmate.training.distribution import PlannedMemory
from checkmate.training.planning import Compiled, Settings, generate_step_function, signature_of
from checkmate.training.ranks import on_every_rank

log = logging.getLogger(__name__)

__all__ = ["Sharded", "UnitCalls", "compile_sharded"]


def compile_sharded(
    model: nn.Module, loss_fn: LossFunction, batch: Sequence[Any], settings: Settings, options: ShardedOptions
) -> CompiledStep:
    """Plan the step of an FSDP2 model on every rank and return the step that runs rank 0's plan with FSDP2's
    gathers and reductions.

    A collective call: every rank of the model's process group must make it, with a batch of the same shapes.

    Raises:
        ShardedTrainingError: the model uses a feature the step does not reproduce (see the module doc).
        RankFailed: another rank failed to check or plan the step.
    """
    check_root(model)
    initialize(model)
    units = units_of(model)
    if not units:
        raise ShardedTrainingError("the sharded model has no parameters to shard: compile it without fully_shard")
    group = fsdp2.shard_process_group(units[0].group)

    def check() -> None:
        check_supported(model)

    on_every_rank(check, group, fsdp2.device(units[0].group), what="checking the sharded model")
    distribution = Sharded(model, units, group, options, settings.capture.gradient_memory)
    compiled = distribution.plan(loss_fn, batch, settings)
    return CompiledStep(model, loss_fn, settings, {signature_of(batch): compiled}, distribution)


@dataclass(frozen=True)
class UnitPlacement:
    """What places the units' calls in a schedule of one capture (one batch shape).

    Attributes:
        units: the capture's parameters among the units, with FSDP2's `reshard_after_forward`.
        no_remat_peak: the sharded peak of the step without recomputation, the units gathered as FSDP2 would.
        budget: the budget in bytes (a fraction is of `no_remat_peak`).
    """

    units: CapturedUnits
    no_remat_peak: int
    budget: int

    def peak(self, schedule: Schedule) -> int:
        """The per-rank peak of `schedule` with the units' calls placed where its plan gathers them
        (`checkmate.sharded.memory.sharded_peak`)."""
        return sharded_peak(schedule, self.units.use, self.units.sizes)


@dataclass(frozen=True)
class UnitCalls:
    """The sharded step's schedule pass (`checkmate.execute.passes`, order PLACE): each unit's gather, free,
    prefetch and reduce placed among the steps, each a `Call` of `act`; and what the units hold at each compute step,
    so that an executor's fused runs stay within the sharded peak.

    Attributes:
        placement: the units of this capture.
        names: each unit's module name, for the generated source.
        act: runs one unit call.
    """

    placement: UnitPlacement
    names: tuple[str, ...]
    act: Callable[[UnitCall], None] = field(compare=False)
    order: PassOrder = PassOrder.PLACE

    def __call__(self, lowering: Lowering) -> Lowering:
        schedule = lowering.schedule
        use = self.placement.units.use
        sizes = self.placement.units.sizes
        steps = tuple(
            Call(f"{step.action.value} unit {step.unit} ({self.names[step.unit]!r})", functools.partial(self.act, step))
            if isinstance(step, UnitCall)
            else step
            for step in place_unit_calls(lowering.steps, use, _presence(schedule, sizes))
        )
        held = tuple(
            before + units for before, units in zip(lowering.held, held_at_computes(schedule, use, sizes), strict=True)
        )
        return dataclasses.replace(
            with_steps(lowering, steps), held=held, peak=max(lowering.peak, sharded_peak(schedule, use, sizes))
        )


class Sharded:
    """FSDP2 as the distribution of a compiled step (`checkmate.training.distribution`): the plan's step, with each
    unit gathered, freed and reduced as FSDP2 does.

    Every rank must run the same plan: call `use_plan` and `load_plan` on every rank with the same plan, and give
    every rank a batch of a new shape in the same call.

    Attributes:
        model: the sharded model given to `compile`.
        units: the model's FSDP2 units, in module order.
        group: the process group the units shard over.
        options: how the units' calls are placed.
    """

    plans_alone = False  # every rank plans a new shape together, and runs rank 0's plan
    description = "the sharded step"

    def __init__(
        self,
        model: nn.Module,
        units: tuple[Unit, ...],
        group: Any,
        options: ShardedOptions,
        gradient_memory: GradientMemory,
    ) -> None:
        self.model = model
        self.units = units
        self.group = group
        self.options = options
        self.gradient_memory = gradient_memory
        self._gradients: ShardedGradients | None = None
        self._prefetched: dict[int, Any] = {}  # unit: FSDP2's UnshardHandle of an all-gather started early

    @property
    def module(self) -> nn.Module:
        return self.model

    @property
    def fixed_memory(self) -> int:
        """This rank's shards in place of the full parameters and gradients (`sharding_fixed_memory`; the full
        parameters exist once FSDP2 has gathered them, as planning does)."""
        return sharding_fixed_memory(self.units, self.gradient_memory)

    def plan(self, loss_fn: LossFunction, batch: Sequence[Any], settings: Settings) -> Compiled:
        """`batch`'s step planned on every rank (a collective call), with the units' calls placed."""
        planned = plan_sharded(
            self.model,
            self.units,
            loss_fn,
            batch,
            settings,
            self.group,
            prefetch_gathers=self.options.prefetch_gathers,
            hold_gathered=self.options.hold_gathered,
            overlap_gathers=self.options.overlap_gathers,
        )
        placed = self._with_unit_calls(planned)
        generate_step_function(placed, settings)
        return placed

    def _with_unit_calls(self, compiled: Compiled) -> Compiled:
        """`compiled` with the units' calls as a pass of its program."""
        units_of_capture = captured_units(
            compiled.captured,
            self.units,
            prefetch_gathers=self.options.prefetch_gathers,
            gradient_memory=self.gradient_memory,
        )
        no_remat = schedule_of(compiled.captured.graph, compiled.no_remat)
        no_remat_peak = sharded_peak(no_remat, units_of_capture.use, units_of_capture.sizes)
        budget = resolve_budget(compiled.plan.budget or 1.0, no_remat_peak)
        placement = UnitPlacement(units_of_capture, no_remat_peak, budget)
        names = tuple(unit.name for unit in self.units)
        program = compiled.program.with_passes(UnitCalls(placement, names, self._act))
        return dataclasses.replace(compiled, program=program)

    def before_step(self) -> None:
        return None

    def parameters(self, compiled: Compiled) -> list[torch.Tensor]:
        """The full parameters, whatever their storage holds when the step starts (a gather fills it)."""
        return list(_placement(compiled).units.parameters)

    def gradient_sink(self, compiled: Compiled, parameters: Sequence[torch.Tensor]) -> StepGradients:
        """Each unit's gradients, reduce-scattered into the sharded `.grad`s by its REDUCE call."""
        self._gradients = ShardedGradients(parameters, _placement(compiled).units.unit_of, self.units)
        return self._gradients

    def baseline(self, leaves: Sequence[Any]) -> list[torch.Tensor]:
        """What a metered call starts with that the plan counts: this rank's parameter and gradient shards (their
        local tensors), the buffers and the batch."""
        parameters = list(self.model.parameters())
        tensors = [_local(parameter) for parameter in parameters]
        tensors += [_local(parameter.grad) for parameter in parameters if parameter.grad is not None]
        return [*tensors, *self.model.buffers(), *(leaf for leaf in leaves if isinstance(leaf, torch.Tensor))]

    def memory(self, compiled: Compiled) -> PlannedMemory:
        """This rank's sharded figures: the peaks and the budget count the gathered parameters, the unsharded
        gradients and FSDP2's reduce buffers (`checkmate.sharded.memory`)."""
        placement = _placement(compiled)
        return PlannedMemory(placement.no_remat_peak, placement.budget, placement.peak(compiled.schedule))

    def held_units(self, compiled: Compiled) -> tuple[int, ...]:
        """The units (indices into `units`) that FSDP2 would free after their forward and gather again, and that
        `compiled`'s plan keeps gathered from their forward to their backward instead (`checkmate.fetched`): one
        all-gather fewer each, per step."""
        placement = _placement(compiled)
        use = placement.units.use
        positions = unit_positions(compiled.schedule.steps, use)
        twice = [unit for unit in positions.forward_reads if unit in positions.backward_reads]
        gathers = fetches(compiled.schedule.presence) if compiled.schedule.presence.size else None
        return tuple(
            unit
            for unit in sorted(twice)
            if use.reshard_after_forward[unit] and gathers is not None and gathers[unit] == 1
        )

    def _act(self, call: UnitCall) -> None:
        unit = self.units[call.unit]
        if call.action == PREFETCH:
            self._prefetched[call.unit] = unit.module.unshard(async_op=True)
        elif call.action == GATHER:
            handle = self._prefetched.pop(call.unit, None)
            if handle is None:
                unit.module.unshard()
            else:
                handle.wait()
        elif call.action == FREE:
            unit.module.reshard()
        elif call.action == REDUCE:
            assert self._gradients is not None
            self._gradients.reduce(call.unit)


def _presence(schedule: Schedule, sizes: UnitBytes) -> np.ndarray | None:
    """The plan's presence of each unit's parameters, or None for a plan without it (FSDP2's placement)."""
    return schedule.presence if schedule.presence.shape[1:] == (len(sizes.parameters),) else None


def _placement(compiled: Compiled) -> UnitPlacement:
    """The unit placement of `compiled`'s capture, held by its program's `UnitCalls` pass."""
    for schedule_pass in compiled.program.passes:
        if isinstance(schedule_pass, UnitCalls):
            return schedule_pass.placement
    raise ShardedTrainingError("this planned step has no units' calls: it was not planned by checkmate.sharded")


def _local(tensor: torch.Tensor) -> torch.Tensor:
    """This rank's part of a sharded (DTensor) parameter or gradient; a plain tensor itself."""
    return tensor.to_local() if isinstance(tensor, DTensor) else tensor
