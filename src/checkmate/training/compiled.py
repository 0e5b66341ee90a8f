"""The step `checkmate.compile` returns: a training step that runs forward and backward as a plan says.

    loss = step(*batch)          # forward + backward by the plan; .grad filled as loss.backward() would
    optimizer.step(); optimizer.zero_grad()
    print(step.report())

Each call feeds the model's current parameters and buffers (an optimizer's updates are seen), runs the schedule
as its generated step function (`checkmate.execute.program`), accumulates gradients into `.grad` as eager autograd
does (also of batch tensors that require a gradient), writes buffer updates (BatchNorm running statistics) once, and
returns what loss_fn returns, detached. Plans are kept per batch signature and guard state
(`checkmate.training.guards`), all within the budget in bytes fixed at compile. A new batch shape runs the plan of a
larger one where its graph has the same structure and the plan fits (`checkmate.training.shape_reuse`; `improve`
plans it for itself); anything else new is captured and planned again (`checkmate.training.planning`), or refused
with `replan=False`.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import time
from collections.abc import Sequence
from typing import Any, NamedTuple

import torch
from torch import nn
from torch.utils import _pytree as pytree

from checkmate import plan_cache
from checkmate.byte_sizes import format_bytes
from checkmate.captured import Captured
from checkmate.errors import ExecutionError, InfeasibleBudget
from checkmate.execute.gradients import WithBatchGradients
from checkmate.execute.memory import measure_peak, synchronize
from checkmate.execute.predicted_time import predicted_seconds
from checkmate.execute.program import run_schedule
from checkmate.graph import Graph
from checkmate.plan import Plan, schedule_of
from checkmate.simulate import transfer_time
from checkmate.torch_capture import model_device
from checkmate.torch_capture.trace import LossFunction
from checkmate.training.distribution import Distribution, PlannedMemory
from checkmate.training.guards import Guards, GuardState, check_grad_mode
from checkmate.training.planning import BatchSignature, Compiled, Settings, batch_signature, in_bytes, signature_of
from checkmate.training.shape_reuse import describe, reuse_plan
from checkmate.training.step_report import StepReport, moves_report

log = logging.getLogger(__name__)


class PlanKey(NamedTuple):
    """What a plan is kept by: the batch's signature and the guarded values its trace depended on."""

    batch: BatchSignature
    guards: GuardState


class CompiledStep:
    """A training step that runs forward and backward as a rematerialization plan says.

    It holds two parts that vary: the executor that runs a plan's schedule (`settings.executor`,
    `checkmate.executors`) and the distribution that runs it across processes (`distribution`,
    `checkmate.training.distribution`: one process, DDP or FSDP2).

    Attributes:
        model: the module whose parameters, gradients and buffers each call uses and updates (as given to
            `compile`: a DistributedDataParallel stays the wrapper; `module` is the module it wraps).
        loss_fn: the loss function given to `compile`.
        distribution: how the step runs across processes.
    """

    def __init__(
        self,
        model: nn.Module,
        loss_fn: LossFunction,
        settings: Settings,
        compiled: dict[BatchSignature, Compiled],
        distribution: Distribution,
    ) -> None:
        self.model = model
        self.loss_fn = loss_fn
        self.distribution = distribution
        self._settings = in_bytes(settings, next(iter(compiled.values())))
        self._guards = Guards(self.module, loss_fn, model_device(self.module).type)
        for planned in compiled.values():
            self._guards.watch(planned.captured.attribute_reads)
        state = self._guards.state()
        self._compiled = {PlanKey(signature, state): planned for signature, planned in compiled.items()}
        self._current = next(iter(self._compiled))
        self._measured_peak: dict[PlanKey, int] = {}
        self._measured_time: float | None = None

    @property
    def module(self) -> nn.Module:
        """The module whose step is captured and planned: `model` itself (a data-parallel step: the wrapped one)."""
        return self.distribution.module

    @property
    def compiled(self) -> Compiled:
        """The planned step of the batch shape used last."""
        return self._compiled[self._current]

    @property
    def plan(self) -> Plan:
        """The plan of the batch shape used last (the compile batch until another shape is run)."""
        return self._compiled[self._current].plan

    @property
    def graph(self) -> Graph:
        """The planning graph of the batch shape used last."""
        return self._compiled[self._current].captured.graph

    @property
    def captured(self) -> Captured:
        """The captured step of the batch shape used last."""
        return self._compiled[self._current].captured

    def __call__(self, *batch: Any) -> Any:
        """Run forward and backward on `batch` following the plan; returns what loss_fn returns, detached: the loss,
        or the tuple, list, dict or ModelOutput holding it and the other values loss_fn returned.

        Gradients are added into each parameter's `.grad` (set when it is None), and into the `.grad` of each batch
        tensor that requires one, and buffers that the step updates (BatchNorm running statistics) are written once.
        A batch of a new signature, or a change in what the plan's trace depended on (`model.train()`, a module
        attribute its forward read, autocast: `checkmate.training.guards`), is captured and planned again; a state
        seen before reuses its plan.

        Raises:
            ExecutionError: gradients are disabled (`torch.no_grad()`), or a new plan is needed and the step was
                compiled with `replan=False`.
        """
        check_grad_mode()
        leaves, spec = pytree.tree_flatten(tuple(batch))
        key = PlanKey(batch_signature(leaves, spec), self._guards.state())
        compiled = self._compiled.get(key)
        if compiled is None:
            compiled = self._replan(batch, key)
            key = self._guard_reads_of(compiled, key)
        self._check_gradients_start_empty(compiled)
        self._current = key
        measure = self._settings.measure_memory == "every" or (
            self._settings.measure_memory == "first" and key not in self._measured_peak
        )
        return self._run(compiled, leaves, measure)

    def _check_gradients_start_empty(self, compiled: Compiled) -> None:
        """A plan that counts gradients from the ops that make them has no room for `.grad`s held from before."""
        if self._settings.capture.gradient_memory != "when_made":
            return
        held = [
            name
            for (module, slot), name in zip(compiled.parameter_slots, compiled.captured.parameter_names, strict=True)
            if getattr(module, slot).grad is not None
        ]
        if held:
            raise ExecutionError(
                f"this step was compiled with gradient_memory='when_made', which plans for no `.grad` at the start of "
                f"a step, and {len(held)} parameters have one (first: {held[0]!r}): call optimizer.zero_grad() "
                "(set_to_none=True, its default) before each step, or compile with gradient_memory='whole_step'"
            )

    def _replan(self, batch: Sequence[Any], key: PlanKey) -> Compiled:
        """The step of a key not seen yet: the plan of a larger batch where it fits (`checkmate.training.shape_reuse`:
        the batch is traced as the model and loss_fn are now), else planned for it."""
        change = self._what_changed(key)
        if not self._settings.replan:
            raise ExecutionError(
                f"this step was planned for batch {describe(self.captured.batch_shapes)} and got {change}: compile "
                "with replan=True, or pass a batch of the planned shape"
            )
        reused = (
            reuse_plan(
                self.module,
                self.loss_fn,
                batch,
                self._settings,
                self._compiled.values(),
                fixed_memory=self.distribution.fixed_memory,
            )
            if self.distribution.plans_alone
            else "every rank plans it together"
        )
        if isinstance(reused, Compiled):
            log.info(
                "%s: running the plan of batch %s (fits: planned peak %s of the budget %s); call "
                "step.improve(*batch) with a batch of this shape to plan it for itself",
                change,
                describe(reused.reused_from or ()),
                format_bytes(reused.plan.peak_memory),
                format_bytes(reused.plan.budget or 0),
            )
            compiled = reused
        else:
            log.info("%s: capturing and planning again (%s)", change, reused)
            compiled = self._plan_shape(batch, change)
        self._compiled[key] = compiled
        return compiled

    def _what_changed(self, key: PlanKey) -> str:
        """How `key` differs from the plan used last, for the log and errors."""
        if key.batch != self._current.batch:
            return f"batch {describe(key.batch[1], key.batch[2])}"
        return self._guards.describe_change(self._current.guards, key.guards)

    def _guard_reads_of(self, compiled: Compiled, key: PlanKey) -> PlanKey:
        """Guard what a new capture read as well; the plans kept so far are keyed with those values as they are now
        (their traces did not read them). Returns `key` as kept."""
        if not self._guards.watch(compiled.captured.attribute_reads):
            return key
        self._compiled = {PlanKey(k.batch, self._guards.extended(k.guards)): v for k, v in self._compiled.items()}
        self._measured_peak = {
            PlanKey(k.batch, self._guards.extended(k.guards)): v for k, v in self._measured_peak.items()
        }
        self._current = PlanKey(self._current.batch, self._guards.extended(self._current.guards))
        return PlanKey(key.batch, self._guards.extended(key.guards))

    def _plan_shape(self, batch: Sequence[Any], change: str) -> Compiled:
        """`batch`'s step planned for it as the model and loss_fn are now, within the budget in bytes fixed at
        compile; `change` says what is new, for the log and errors."""
        started = time.perf_counter()
        try:
            compiled = self.distribution.plan(self.loss_fn, batch, self._settings)
        except InfeasibleBudget as refusal:
            raise InfeasibleBudget(
                f"{change}: {refusal} (the budget was fixed in bytes at compile, for every batch shape and model "
                "state: compile with a budget in bytes that the largest step fits)",
                budget=refusal.budget,
                minimum=refusal.minimum,
            ) from refusal
        log.info("%s: planned in %.1f s", change, time.perf_counter() - started)
        return compiled

    def improve(self, *batch: Any) -> Plan:
        """Plan `batch`'s shape for itself and run that plan from now on; returns the plan.

        A batch shape the step has not planned runs the plan of a larger one when it fits
        (`checkmate.training.shape_reuse`): no stall in the training loop, but a plan made for other sizes. This
        captures and plans the shape as `compile` does (profiling included), within the same budget in bytes. A shape
        already planned for itself keeps its plan; one not seen yet is planned now, before its first call.

        Raises:
            InfeasibleBudget: no plan of the method fits the budget at this shape.
        """
        key = PlanKey(signature_of(batch), self._guards.state())
        compiled = self._compiled.get(key)
        if compiled is None or compiled.reused_from is not None:
            compiled = self._plan_shape(batch, f"batch {describe(key.batch[1], key.batch[2])}")
            self._compiled[key] = compiled
            self._measured_peak.pop(key, None)
            key = self._guard_reads_of(compiled, key)
        return compiled.plan

    def _run(self, compiled: Compiled, leaves: list[Any], measure: bool) -> Any:
        distribution = self.distribution
        distribution.before_step()
        parameters = distribution.parameters(compiled)
        buffers = [getattr(module, name) for module, name in compiled.buffer_slots]
        inputs = [p.detach() for p in parameters] + buffers + leaves
        device = parameters[0].device if parameters else torch.device("cpu")
        gradients = distribution.gradient_sink(compiled, parameters)
        if any(compiled.captured.input_gradients):
            gradients = WithBatchGradients(gradients, len(parameters), leaves)
        timed = not measure or device.type == "cuda"
        synchronize(device)
        started = time.perf_counter()
        if measure:
            allocator = self._settings.executor.metered_by_allocator
            with measure_peak(device, distribution.baseline(leaves), allocator=allocator) as meter:
                outputs = run_schedule(compiled.program, compiled.schedule, inputs, on_gradient=gradients)
                gradients.finish()
                _write_buffers(buffers, outputs.buffer_updates)
            self._measured_peak[self._current] = meter.peak_bytes
            _check_measured_peak(meter.peak_bytes, distribution.memory(compiled), distribution.description, device)
        else:
            outputs = run_schedule(compiled.program, compiled.schedule, inputs, on_gradient=gradients)
            gradients.finish()
            _write_buffers(buffers, outputs.buffer_updates)
        synchronize(device)
        if timed:
            self._measured_time = time.perf_counter() - started
        loss_output = compiled.captured.loss_output
        return outputs.loss if loss_output is None else loss_output.rebuild(outputs.loss, outputs.outputs)

    def report(self) -> StepReport:
        """Planned figures of the current batch shape (as its distribution holds it: a sharded step's count the
        gathered parameters) and, once measured, the live-tensor peak and step time."""
        compiled = self._compiled[self._current]
        plan = compiled.plan
        memory = self.distribution.memory(compiled)
        extra_compute = plan.cost / compiled.no_remat.cost - 1.0 if compiled.no_remat.cost > 0 else 0.0
        measured_costs = compiled.captured.cost_model == "profile"
        return StepReport(
            method=plan.method,
            status=plan.status,
            gap=plan.gap,
            cost_model=compiled.captured.cost_model,
            nodes=compiled.captured.graph.size,
            no_remat_peak=memory.no_remat_peak,
            budget=memory.budget,
            planned_peak=memory.planned_peak,
            planned_extra_compute=extra_compute,
            measured_peak=self._measured_peak.get(self._current),
            measured_time=self._measured_time,
            reused_from=None if compiled.reused_from is None else describe(compiled.reused_from),
            planned_time=plan.cost if measured_costs else None,
            predicted_time=(
                predicted_seconds(compiled.captured.graph, compiled.program.run_steps(compiled.schedule))
                + transfer_time(compiled.captured.graph, plan.R, plan.S, plan.moves)
                if measured_costs
                else None
            ),
            planning_times=compiled.stage_times,
            moves=moves_report(compiled.captured.graph, plan),
        )

    def save_plan(self, path: str | os.PathLike[str]) -> None:
        """Write the current plan to `path` (JSON with a fingerprint of its graph)."""
        compiled = self._compiled[self._current]
        plan_cache.write_plan(path, compiled.plan, compiled.captured.graph, cost_model=compiled.captured.cost_model)

    def load_plan(self, path: str | os.PathLike[str]) -> Plan:
        """Use the plan saved at `path` for the current batch shape; it must have been made for this graph and fit
        this step's budget (checked by simulation).

        Raises:
            CheckmateError: the file holds a plan for another graph.
            InvalidSchedule: the plan breaks a constraint on this graph, or peaks over this step's budget.
        """
        compiled = self._compiled[self._current]
        budget = compiled.plan.budget if compiled.plan.budget is not None else compiled.no_remat.peak_memory
        graph, cost_model = compiled.captured.graph, compiled.captured.cost_model
        return self.use_plan(plan_cache.read_plan(path, graph, cost_model=cost_model, budget=budget))

    def use_plan(self, plan: Plan) -> Plan:
        """Run the current batch shape with `plan` (from `checkmate.solve(step.graph, ...)`, say) from now on.

        Raises:
            InvalidSchedule: the plan breaks a constraint on this graph (or has the wrong size).
        """
        compiled = self._compiled[self._current]
        schedule = schedule_of(compiled.captured.graph, plan)
        compiled.program.step_function(schedule)  # generated now, as plan_step does, not inside a metered step
        self._compiled[self._current] = dataclasses.replace(compiled, plan=plan, schedule=schedule, reused_from=None)
        self._measured_peak.pop(self._current, None)
        return plan


def _check_measured_peak(measured: int, memory: PlannedMemory, what: str, device: torch.device) -> None:
    """Warn when a step held more than its plan said: the budget is checked at run time, not only assumed."""
    if measured <= memory.planned_peak:
        return
    cause = (
        "CUDA counts allocator rounding and library workspaces, which the plan does not model; leave headroom in the "
        "budget"
        if device.type == "cuda"
        else "the memory model missed something here; please report the model"
    )
    log.warning(
        "%s's measured peak %s is above the plan's %s by %s; the budget is %s (%s)",
        what.capitalize(),
        format_bytes(measured),
        format_bytes(memory.planned_peak),
        format_bytes(measured - memory.planned_peak),
        format_bytes(memory.budget),
        cause,
    )


def _write_buffers(buffers: Sequence[torch.Tensor], updates: Sequence[torch.Tensor | None]) -> None:
    with torch.no_grad():
        for buffer, update in zip(buffers, updates, strict=True):
            if update is not None:
                buffer.copy_(update)
