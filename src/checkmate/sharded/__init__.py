"""Sharded training: `checkmate.compile` of a model sharded with FSDP2's `fully_shard` gives eager FSDP2's gradients.

    torch.distributed.init_process_group("gloo")                    # or "nccl"; torchrun sets the environment
    for block in model.blocks:
        fully_shard(block)
    fully_shard(model)
    step = checkmate.compile(model, loss_fn, batch, budget=0.5)     # every rank calls, with batches of one shape
    loss = step(*batch); optimizer.step(); optimizer.zero_grad()

What is built (the first part of issue 21):

* Capture and plan (`checkmate.sharded.planning`). The step is captured on the unsharded model (every unit gathered
  once at compile time), so the plan's graph is the op graph of a single-process step. Every rank plans; rank 0's
  plan is broadcast and run on every rank (`checkmate.sharded.agreement`), after checking that every rank captured
  the same step. A rank whose planning fails makes every rank raise at once (`checkmate.training.ranks`).
* Running (`checkmate.sharded.timeline`). The plan's schedule runs with each unit's all-gather placed before the
  first step that reads its parameters, its free after its last forward read when `reshard_after_forward` says so
  (FSDP2 keeps the root's), its all-gather again before its first backward read, and FSDP2's post-backward after
  its last step: the reduce-scatter into the sharded `.grad` with FSDP2's own arithmetic (`foreach_reduce`), or with
  `set_requires_gradient_sync(False)` the local accumulation. The gathers and frees are FSDP2's own (`unshard`,
  `reshard`): the full parameters keep one tensor each, whose storage a gather fills and a free empties, so the
  schedule reads them as plain inputs. Every rank issues the same collectives in the same order. With two ranks the
  sharded `.grad`s equal eager FSDP2's bit for bit (tests/torch/test_sharded.py).
* Memory (`checkmate.sharded.memory`): the budget is this rank's peak. The plan's graph holds this rank's shards of
  the parameters and of their gradients (padded as FSDP2 pads them), the buffers and the batch in its fixed memory,
  and its activations as in a single-process step. Around it the step holds each unit's gathered parameters from its
  gather to its free, its unsharded gradients from the op that makes each to its reduce-scatter, FSDP2's
  reduce-scatter buffers and, on gloo, the collectives' copies; `sharded_peak` counts them at the places the
  schedule puts each unit's calls, and `checkmate.sharded.planning` solves the graph within the budget less what
  they hold (again lower when the sharded peak is still over). `step.report()` gives the sharded figures. On 2 gloo
  ranks the allocator's per-rank peak is at or below the planned one (tests/torch/test_sharded.py). Optimizer state
  is not counted, as in a single-process step.

Each unit's all-gather but the first is prefetched, as FSDP2 does (`checkmate.sharded.timeline`). A unit FSDP2 would
gather twice is held from its forward to its backward where the budget has room (`checkmate.sharded.holds`).
Reduce-scatters run inside FSDP2's post-backward: on CUDA on its reduce-scatter stream, overlapping the steps after
them as in eager FSDP2; on CPU synchronous, as in eager FSDP2. Not built yet (issue 21): a hold bought with
recomputation (priced in communication); the Inductor executor; `gradient_memory="when_made"`.
Refused with ShardedTrainingError: CPU offload, mixed precision, HSDP (2-D meshes), tensor-parallel parameters,
all-gather extensions, several parameter groups per unit, a root that is not sharded, and uneven inputs (another
batch shape on some rank). A new batch shape is planned again on every rank together: every rank must meet it in
the same call.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn
from torch.distributed.tensor import DTensor

from checkmate.byte_sizes import format_bytes, resolve_budget
from checkmate.errors import ShardedTrainingError
from checkmate.execute.codegen import Call
from checkmate.execute.gradients import StepGradients
from checkmate.plan import Plan
from checkmate.sharded.gradients import ShardedGradients
from checkmate.sharded.holds import hold_gathered, kept_gathered
from checkmate.sharded.layout import UnitLayout, unit_layout
from checkmate.sharded.memory import sharded_peak
from checkmate.sharded.planning import plan_sharded
from checkmate.sharded.timeline import FREE, GATHER, PREFETCH, REDUCE, UnitCall, UnitUse, place_unit_calls
from checkmate.sharded.units import Unit, check_root, check_supported, initialize, units_of
from checkmate.simulate import Schedule, Step, lower
from checkmate.torch_capture.trace import LossFunction
from checkmate.training.compiled import CompiledStep, PlanKey
from checkmate.training.planning import BatchSignature, Compiled, Settings, signature_of
from checkmate.training.ranks import on_every_rank
from checkmate.training.step_report import StepReport

log = logging.getLogger(__name__)

__all__ = ["ShardedStep", "compile_sharded"]


def compile_sharded(model: nn.Module, loss_fn: LossFunction, batch: Sequence[Any], settings: Settings) -> ShardedStep:
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
    group = units[0].group.mesh_info.shard_process_group

    def check() -> None:
        check_supported(model)
        if settings.capture.gradient_memory != "whole_step":
            raise ShardedTrainingError(
                "gradient_memory='when_made' is not supported for a sharded model yet: use 'whole_step' (the default)"
            )

    on_every_rank(check, group, units[0].group.device, what="checking the sharded model")
    planned = plan_sharded(model, units, loss_fn, batch, settings, group)
    return ShardedStep(model, loss_fn, settings, {signature_of(batch): planned}, units=units, group=group)


class ShardedStep(CompiledStep):
    """A compiled step of an FSDP2 model: the plan's step, with each unit gathered, freed and reduced as FSDP2 does.

    Every rank must run the same plan: call `use_plan` and `load_plan` on every rank with the same plan, and give
    every rank a batch of a new shape in the same call.

    Attributes:
        units: the model's FSDP2 units, in module order.
        group: the process group the units shard over.
    """

    def __init__(
        self,
        model: nn.Module,
        loss_fn: LossFunction,
        settings: Settings,
        compiled: dict[BatchSignature, Compiled],
        *,
        units: tuple[Unit, ...],
        group: Any,
    ) -> None:
        self.units = units
        self.group = group
        self._gradients: ShardedGradients | None = None
        self._prefetched: dict[int, Any] = {}  # unit: FSDP2's UnshardHandle of an all-gather started early
        self._placements: dict[int, _Placement] = {}  # by id of the program they were made for
        super().__init__(
            model, loss_fn, settings, {key: self._with_units(value, settings) for key, value in compiled.items()}
        )

    def _with_units(self, planned: Compiled, settings: Settings) -> Compiled:
        """`planned` with its schedule's steps and the units' calls placed among them, as one step function."""
        layout = unit_layout(planned.captured, self.units)
        no_remat = lower(planned.captured.graph, planned.no_remat.R, planned.no_remat.S)
        no_remat_peak = sharded_peak(no_remat, layout.use, layout.sizes)
        placement = _Placement(layout, no_remat_peak, resolve_budget(settings.budget, no_remat_peak))
        program = dataclasses.replace(
            planned.program, fuse=functools.partial(self._placed_steps, placement), step_functions={}
        )
        self._placements[id(program)] = placement
        program.step_function(planned.schedule)  # generated now, not inside a metered step
        return dataclasses.replace(planned, program=program)

    def _replan(self, batch: Sequence[Any], signature: PlanKey) -> Compiled:
        if not self._settings.replan:
            return super()._replan(batch, signature)
        change = self._what_changed(signature)
        log.info("%s: capturing and planning again on every rank", change)
        planned = self._plan_shape(batch, change)
        self._compiled[signature] = planned
        return planned

    def _plan_shape(self, batch: Sequence[Any], change: str) -> Compiled:
        """`batch`'s step planned on every rank (a collective call), with the units' calls placed; `change` says
        what is new (the log on each rank said it already)."""
        return self._with_units(
            plan_sharded(self.model, self.units, self.loss_fn, batch, self._settings, self.group), self._settings
        )

    def _baseline(self, leaves: list[Any]) -> list[torch.Tensor]:
        """What a metered call starts with that the plan counts: this rank's parameter and gradient shards (their
        local tensors), the buffers and the batch."""
        parameters = list(self.model.parameters())
        tensors = [_local(parameter) for parameter in parameters]
        tensors += [_local(parameter.grad) for parameter in parameters if parameter.grad is not None]
        return [*tensors, *self.model.buffers(), *(leaf for leaf in leaves if isinstance(leaf, torch.Tensor))]

    def _check_measured_peak(self, measured: int, plan: Plan, device: torch.device) -> None:
        """Warn when a metered call held more than the sharded step's planned peak (`sharded_peak`)."""
        planned = self.report().planned_peak
        if measured > planned:
            log.warning(
                "the sharded step's measured peak %s is above its planned %s by %s (the memory model of "
                "checkmate.sharded missed something here; please report the model)",
                format_bytes(measured),
                format_bytes(planned),
                format_bytes(measured - planned),
            )

    def report(self) -> StepReport:
        """The single-process report with this rank's sharded figures: the peaks and the budget count the gathered
        parameters, the unsharded gradients and FSDP2's reduce buffers (`checkmate.sharded.memory`)."""
        report = super().report()
        compiled = self._compiled[self._current]
        placement = self._placements[id(compiled.program)]
        layout = placement.layout
        return dataclasses.replace(
            report,
            no_remat_peak=placement.no_remat_peak,
            budget=placement.budget,
            planned_peak=sharded_peak(compiled.schedule, placement.use(compiled.schedule), layout.sizes),
        )

    @property
    def held_units(self) -> tuple[int, ...]:
        """The units (indices into `units`) that FSDP2 would free after their forward and the current plan's step
        keeps gathered until their backward instead, since the budget has room for them (`checkmate.sharded.holds`):
        one all-gather fewer each, per step."""
        compiled = self._compiled[self._current]
        placement = self._placements[id(compiled.program)]
        freed = placement.layout.use.reshard_after_forward
        return tuple(unit for unit in kept_gathered(placement.use(compiled.schedule)) if freed[unit])

    def _parameters(self, compiled: Compiled) -> list[torch.Tensor]:
        return list(self._placements[id(compiled.program)].layout.parameters)

    def _gradient_sink(self, compiled: Compiled, parameters: Sequence[torch.Tensor]) -> StepGradients:
        unit_of = self._placements[id(compiled.program)].layout.unit_of
        self._gradients = ShardedGradients(parameters, unit_of, self.units)
        return self._gradients

    def _placed_steps(self, placement: _Placement, schedule: Schedule) -> tuple[Step | Call, ...]:
        return tuple(
            Call(f"{step.action} unit {step.unit} ({self.units[step.unit].name!r})", functools.partial(self._act, step))
            if isinstance(step, UnitCall)
            else step
            for step in place_unit_calls(schedule.steps, placement.use(schedule))
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


@dataclass(frozen=True)
class _Placement:
    """What places the units' calls in a schedule of one capture.

    Attributes:
        layout: the capture's parameters among the units, with FSDP2's `reshard_after_forward`.
        no_remat_peak: the sharded peak of the step without recomputation, in FSDP2's layout.
        budget: the budget in bytes (a fraction is of `no_remat_peak`).
    """

    layout: UnitLayout
    no_remat_peak: int
    budget: int

    def use(self, schedule: Schedule) -> UnitUse:
        """The units' use in `schedule`: FSDP2's, with the units held from forward to backward that fit the
        budget (`checkmate.sharded.holds`)."""
        return hold_gathered(schedule, self.layout.use, self.layout.sizes, self.budget)


def _local(tensor: torch.Tensor) -> torch.Tensor:
    """This rank's part of a sharded (DTensor) parameter or gradient; a plain tensor itself."""
    return tensor.to_local() if isinstance(tensor, DTensor) else tensor
