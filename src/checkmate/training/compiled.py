"""The step `checkmate.compile` returns: a training step that runs forward and backward as a plan says.

    loss = step(*batch)          # forward + backward by the plan; .grad filled as loss.backward() would
    optimizer.step(); optimizer.zero_grad()
    print(step.report())

Each call feeds the model's current parameters and buffers (an optimizer's updates are seen), runs the schedule
as its generated step function (`checkmate.execute.program`), accumulates gradients into `.grad` as eager autograd
does, writes buffer updates (BatchNorm running statistics) once, and returns the detached loss. Plans are kept per
batch shape and dtype; a new shape is captured and planned again (`checkmate.training.planning`), or refused with
`replan=False`.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import time
from collections.abc import Sequence
from typing import Any

import torch
from torch import nn
from torch.utils import _pytree as pytree

from checkmate.captured import Captured
from checkmate.errors import ExecutionError
from checkmate.execute.gradients import GradientAccumulator, StepGradients
from checkmate.execute.memory import measure_peak, step_baseline, synchronize
from checkmate.execute.program import run_schedule
from checkmate.graph import Graph
from checkmate.plan import Plan
from checkmate.simulate import lower
from checkmate.torch_capture.trace import LossFunction
from checkmate.training import plan_cache
from checkmate.training.planning import BatchSignature, Compiled, Settings, batch_signature, plan_step
from checkmate.training.step_report import StepReport
from checkmate.units import format_bytes

log = logging.getLogger(__name__)

MEASURE_CHOICES = ("first", "every", "never")


class CompiledStep:
    """A training step that runs forward and backward as a rematerialization plan says.

    Attributes:
        model: the module whose parameters, gradients and buffers each call uses and updates (as given to
            `compile`: a DistributedDataParallel stays the wrapper; `module` is the module it wraps).
        loss_fn: the loss function given to `compile`.
    """

    def __init__(
        self, model: nn.Module, loss_fn: LossFunction, settings: Settings, compiled: dict[BatchSignature, Compiled]
    ) -> None:
        self.model = model
        self.loss_fn = loss_fn
        self._settings = settings
        self._compiled = dict(compiled)
        self._current = next(iter(self._compiled))
        self._measured_peak: dict[BatchSignature, int] = {}
        self._measured_time: float | None = None

    @property
    def module(self) -> nn.Module:
        """The module whose step is captured and planned: `model` itself (a data-parallel step: the wrapped one)."""
        return self.model

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

    def __call__(self, *batch: Any) -> torch.Tensor:
        """Run forward and backward on `batch` following the plan; returns the detached loss.

        Gradients are added into each parameter's `.grad` (set when it is None), and buffers that the
        step updates (BatchNorm running statistics) are written once.
        """
        leaves, spec = pytree.tree_flatten(tuple(batch))
        signature = batch_signature(leaves, spec)
        compiled = self._compiled.get(signature) or self._replan(batch, signature)
        self._check_gradients_start_empty(compiled)
        self._current = signature
        measure = self._settings.measure_memory == "every" or (
            self._settings.measure_memory == "first" and signature not in self._measured_peak
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

    def _replan(self, batch: Sequence[Any], signature: BatchSignature) -> Compiled:
        planned = self.captured
        if not self._settings.replan:
            raise ExecutionError(
                f"this step was planned for batch {_describe(planned.batch_shapes)} and got "
                f"{_describe(signature[1])}: compile with replan=True, or pass a batch of the planned shape"
            )
        log.info("new batch signature %s: capturing and planning again", _describe(signature[1]))
        compiled = plan_step(self.module, self.loss_fn, batch, self._settings)
        self._compiled[signature] = compiled
        return compiled

    def _run(self, compiled: Compiled, leaves: list[Any], measure: bool) -> torch.Tensor:
        self._before_step()
        parameters = self._parameters(compiled)
        buffers = [getattr(module, name) for module, name in compiled.buffer_slots]
        inputs = [p.detach() for p in parameters] + buffers + leaves
        device = parameters[0].device if parameters else torch.device("cpu")
        gradients = self._gradient_sink(compiled, parameters)
        timed = not measure or device.type == "cuda"
        synchronize(device)
        started = time.perf_counter()
        if measure:
            allocator = self._settings.executor == "inductor"
            with measure_peak(device, self._baseline(leaves), allocator=allocator) as meter:
                outputs = run_schedule(compiled.program, compiled.schedule, inputs, on_gradient=gradients)
                gradients.finish()
                _write_buffers(buffers, outputs.buffer_updates)
            self._measured_peak[self._current] = meter.peak_bytes
            self._check_measured_peak(meter.peak_bytes, compiled.plan, device)
        else:
            outputs = run_schedule(compiled.program, compiled.schedule, inputs, on_gradient=gradients)
            gradients.finish()
            _write_buffers(buffers, outputs.buffer_updates)
        synchronize(device)
        if timed:
            self._measured_time = time.perf_counter() - started
        return outputs.loss

    def _before_step(self) -> None:
        """Called at the start of each call, before the inputs are read (a data-parallel step syncs buffers)."""

    def _baseline(self, leaves: list[Any]) -> list[torch.Tensor]:
        """The tensors a metered call starts with that the plan counts as fixed (`step_baseline`)."""
        return step_baseline(self.model, leaves)

    def _check_measured_peak(self, measured: int, plan: Plan, device: torch.device) -> None:
        """Warn when a metered call held more than its plan said (`_check_measured_peak`)."""
        _check_measured_peak(measured, plan, device)

    def _parameters(self, compiled: Compiled) -> list[torch.Tensor]:
        """The parameters this call reads and fills `.grad` of, in placeholder order: those now in the model's slots
        (a sharded step: the full parameters, whatever their storage holds when the step starts)."""
        return [getattr(module, name) for module, name in compiled.parameter_slots]

    def _gradient_sink(self, compiled: Compiled, parameters: Sequence[torch.Tensor]) -> StepGradients:
        """Where this call's gradients go: into `.grad`, as eager autograd adds them."""
        return GradientAccumulator(parameters)

    def report(self) -> StepReport:
        """Planned figures of the current batch shape and, once measured, the live-tensor peak and step time."""
        compiled = self._compiled[self._current]
        plan = compiled.plan
        budget = plan.budget if plan.budget is not None else compiled.no_remat.peak_memory
        extra_compute = plan.cost / compiled.no_remat.cost - 1.0 if compiled.no_remat.cost > 0 else 0.0
        return StepReport(
            method=plan.method,
            status=plan.status,
            gap=plan.gap,
            cost_model=compiled.captured.cost_model,
            nodes=compiled.captured.graph.size,
            no_remat_peak=compiled.no_remat.peak_memory,
            budget=budget,
            planned_peak=plan.peak_memory,
            planned_extra_compute=extra_compute,
            measured_peak=self._measured_peak.get(self._current),
            measured_time=self._measured_time,
        )

    def save_plan(self, path: str | os.PathLike[str]) -> None:
        """Write the current plan to `path` (JSON with a fingerprint of its graph)."""
        compiled = self._compiled[self._current]
        plan_cache.write_plan(path, compiled.plan, compiled.captured.graph, cost_model=compiled.captured.cost_model)

    def load_plan(self, path: str | os.PathLike[str]) -> Plan:
        """Use the plan saved at `path` for the current batch shape; it must have been made for this graph.

        Raises:
            CheckmateError: the file holds a plan for another graph.
        """
        captured = self.captured
        return self.use_plan(plan_cache.read_plan(path, captured.graph, cost_model=captured.cost_model))

    def use_plan(self, plan: Plan) -> Plan:
        """Run the current batch shape with `plan` (from `checkmate.solve(step.graph, ...)`, say) from now on.

        Raises:
            InvalidSchedule: the plan breaks a constraint on this graph (or has the wrong size).
        """
        compiled = self._compiled[self._current]
        schedule = lower(compiled.captured.graph, plan.R, plan.S)
        compiled.program.step_function(schedule)  # generated now, as plan_step does, not inside a metered step
        self._compiled[self._current] = dataclasses.replace(compiled, plan=plan, schedule=schedule)
        self._measured_peak.pop(self._current, None)
        return plan


def _check_measured_peak(measured: int, plan: Plan, device: torch.device) -> None:
    """Warn when a step held more than its plan said: the budget is checked at run time, not only assumed."""
    if measured <= plan.peak_memory:
        return
    over = f"by {format_bytes(measured - plan.peak_memory)}"
    budget = "" if plan.budget is None else f"; the budget is {format_bytes(plan.budget)}"
    cause = (
        "CUDA counts allocator rounding and library workspaces, which the plan does not model; leave headroom in the "
        "budget"
        if device.type == "cuda"
        else "the memory model missed something here; please report the model"
    )
    log.warning(
        "the step's measured peak %s is above the plan's %s %s%s (%s)",
        format_bytes(measured),
        format_bytes(plan.peak_memory),
        over,
        budget,
        cause,
    )


def _write_buffers(buffers: Sequence[torch.Tensor], updates: Sequence[torch.Tensor | None]) -> None:
    with torch.no_grad():
        for buffer, update in zip(buffers, updates, strict=True):
            if update is not None:
                buffer.copy_(update)


def _describe(shapes: Sequence[tuple[tuple[int, ...], str]]) -> str:
    return ", ".join(f"{dtype}{list(shape)}" for shape, dtype in shapes)
