"""`checkmate.compile`: capture a training step, plan it within a memory budget, and run it as planned.

    step = checkmate.compile(model, loss_fn, batch, budget=0.5, method="optimal", time_limit=60)
    loss = step(*batch)          # forward + backward by the plan; .grad filled as loss.backward() would
    optimizer.step(); optimizer.zero_grad()
    print(step.report())

Each call feeds the model's current parameters and buffers (an optimizer's updates are seen), runs
the schedule with the interpreter, accumulates gradients into `.grad` as eager autograd does, writes
buffer updates (BatchNorm running statistics) once, and returns the detached loss. Plans are kept per
batch shape and dtype; a new shape is captured and planned again (or refused with `replan=False`).
"""

from __future__ import annotations

import dataclasses
import logging
import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn
from torch.utils import _pytree as pytree

from checkmate.captured import Captured
from checkmate.errors import ExecutionError, InfeasibleBudget, InvalidArgument
from checkmate.execute.gradients import GradientAccumulator, StepGradients
from checkmate.execute.interpreter import Program, run_schedule
from checkmate.execute.memory import measure_peak, step_baseline, synchronize
from checkmate.graph import Graph
from checkmate.plan import Plan
from checkmate.simulate import Schedule, lower
from checkmate.solve import check_solve_options, solve
from checkmate.torch_capture import capture
from checkmate.training import plan_cache
from checkmate.training.executors import (
    CaptureChoice,
    capture_choices,
    capture_options,
    check_executor,
    prepare_executor,
    traced_loss,
)
from checkmate.training.step_report import StepReport
from checkmate.units import format_bytes, resolve_budget

log = logging.getLogger(__name__)

LossFunction = Callable[..., torch.Tensor]
BatchSignature = tuple[Any, tuple[tuple[tuple[int, ...], str], ...]]
MEASURE_CHOICES = ("first", "every", "never")
DEFAULT_TIME_LIMIT = 120.0
TIMED_METHODS = ("optimal", "approx")


@dataclass(frozen=True)
class Settings:
    """How a CompiledStep plans: the budget as given, the method and its options, and the capture options."""

    budget: int | float | str
    method: str
    solve_options: dict[str, Any]
    capture_options: dict[str, Any]
    cache: bool
    replan: bool
    measure_memory: str
    executor: str = "eager"
    cost_model: str = "profile"
    channels_last: bool | None = None


@dataclass(frozen=True)
class Compiled:
    """A step planned for one batch signature.

    The slots are (owning module, attribute name) of each parameter and buffer in placeholder order: each call
    reads the tensor currently there, so a parameter replaced by assignment is seen, without walking the model.
    """

    captured: Captured
    program: Program
    plan: Plan
    schedule: Schedule
    no_remat: Plan
    parameter_slots: tuple[tuple[nn.Module, str], ...]
    buffer_slots: tuple[tuple[nn.Module, str], ...]


def compile(
    model: nn.Module,
    loss_fn: LossFunction,
    batch: Sequence[Any],
    *,
    budget: int | float | str,
    method: str = "optimal",
    cost_model: str = "profile",
    max_nodes: int | None = None,
    cache: bool = True,
    replan: bool = True,
    measure_memory: str = "first",
    gradient_memory: str = "whole_step",
    executor: str = "eager",
    channels_last: bool | None = None,
    **solve_options: Any,
) -> CompiledStep:
    """Plan `loss_fn(model, *batch)` and its backward within `budget`, and return a step that runs that plan.

    Args:
        model: the module to train, on the device it will run on; or a DistributedDataParallel wrapping it, whose
            gradients the step then all-reduces as DDP does (`checkmate.data_parallel`; every rank must call).
        loss_fn: `loss_fn(model, *batch)` returns the scalar loss.
        batch: an example batch (a tuple of tensors, possibly nested); its shapes and dtypes are planned for.
        budget: bytes (an int or a string such as "8GiB"), or a float in (0, 1]: that fraction of the
            peak with no recomputation (the `checkpoint_all` plan). Fixed memory (parameters, gradients,
            buffers, batch) is included.
        method: a strategy name from `checkmate methods`, such as "optimal", "chen_greedy" or "checkpoint_all".
        cost_model: how capture prices ops: "profile", "flops" or "unit".
        max_nodes: let capture merge cheap neighbouring nodes until at most this many remain (faster solves).
        cache: reuse plans cached on disk (`$CHECKMATE_CACHE_DIR`, default `~/.cache/checkmate/plans`).
        replan: plan a batch of a new shape when it arrives; with False such a batch raises ExecutionError.
        measure_memory: when to measure the live-tensor peak: "first" call of each shape, "every" call, or
            "never". On CPU measuring slows the step (each op is intercepted); on CUDA it is free.
        gradient_memory: "whole_step" plans for gradients held all through the step (`.grad`s kept from earlier
            steps, gradient accumulation); "when_made" counts each gradient from the op that makes it, which lowers
            the forward pass's peak by the gradients' bytes, and needs every `.grad` to be None when the step is
            called (`optimizer.zero_grad()`, whose default sets them to None), else the call raises ExecutionError.
        executor: "eager" runs each node's ATen ops (gradients bit for bit eager's); "inductor" runs each planning
            node as one Inductor-compiled function, capture grouping ops as Inductor fuses them and the plan priced
            by the compiled functions as measured, and runs of the schedule as one function each where they measure
            within the plan (`checkmate.inductor`; gradients equal eager's to rounding).
        channels_last: trace a model with 2-D convolutions with its 4-D batch converted to channels-last inside the
            step, so its convolutions run channels-last as `torch.compile` runs them: faster on CPU and GPU, but on
            CPU oneDNN's channels-last convolutions round differently (on the full-size ResNet of
            `benchmarks/peers.py`, gradients 2.7e-2 from float64 where contiguous ones are 5e-6 away). None (the
            default) is False for the eager executor; the Inductor one plans channels-last first and its own layout
            next when the first plan does not fit or recomputes, and runs the plan of least predicted cost
            (`plan_step`).
        **solve_options: options of the method, such as `time_limit=60`. For "optimal" and "approx" the
            time limit defaults to DEFAULT_TIME_LIMIT (120 s) so that a first call cannot hang; the plan is then
            the best found, and `step.plan.status` says whether it was proven optimal.

    Returns:
        A CompiledStep; call it with a batch.

    Raises:
        CaptureError: the model cannot be captured.
        DataParallelError: a DistributedDataParallel uses a setting the step does not reproduce.
        InfeasibleBudget: no plan of `method` fits the budget; the error names the smallest it could meet.

    Example:
        >>> step = checkmate.compile(model, loss_fn, (x, y), budget=0.5, time_limit=30)
        >>> loss = step(x, y)
    """
    if measure_memory not in MEASURE_CHOICES:
        raise InvalidArgument(f"measure_memory must be one of {MEASURE_CHOICES}, got {measure_memory!r}")
    check_executor(executor)
    check_solve_options(method, solve_options)
    if method in TIMED_METHODS:
        solve_options.setdefault("time_limit", DEFAULT_TIME_LIMIT)
    settings = Settings(
        budget=budget,
        method=method,
        solve_options=dict(solve_options),
        capture_options={
            **capture_options(executor, cost_model),
            "max_nodes": max_nodes,
            "gradient_memory": gradient_memory,
        },
        cache=cache,
        replan=replan,
        measure_memory=measure_memory,
        executor=executor,
        cost_model=cost_model,
        channels_last=channels_last,
    )
    if isinstance(model, nn.parallel.DistributedDataParallel) and executor != "eager":
        raise InvalidArgument(
            f"executor={executor!r} with DistributedDataParallel is not supported yet: use executor='eager' (the "
            "default) for a data-parallel step"
        )
    if isinstance(model, nn.parallel.DistributedDataParallel):
        from checkmate.data_parallel import compile_data_parallel

        return compile_data_parallel(model, loss_fn, batch, settings)
    leaves, spec = pytree.tree_flatten(tuple(batch))
    compiled = plan_step(model, loss_fn, batch, settings)
    return CompiledStep(model, loss_fn, settings, {batch_signature(leaves, spec): compiled})


def plan_step(model: nn.Module, loss_fn: LossFunction, batch: Sequence[Any], settings: Settings) -> Compiled:
    """Capture the step for this batch, resolve the budget and plan it (from the disk cache when possible).

    The executor's captures (`capture_choices`) are planned in order, fastest without recomputation first. A plan
    that recomputes nothing ends the search; otherwise the next capture is planned too (a leaner one may fit the same
    budget with less recomputation), and the plan of least predicted cost is kept. The budget in bytes is resolved
    once, against the first capture's peak without recomputation. When no capture fits, the error names the
    smallest budget any of them could meet."""
    budget: int | None = None
    best: Compiled | None = None
    refusals: list[InfeasibleBudget] = []
    for choice in capture_choices(settings.executor, settings.channels_last, model):
        try:
            planned = _plan_capture(model, loss_fn, batch, settings, choice, budget)
        except InfeasibleBudget as refusal:
            log.info("%s: %s", choice.description, refusal)
            budget = refusal.budget
            refusals.append(refusal)
            continue
        if budget is None:
            budget = resolve_budget(settings.budget, planned.no_remat.peak_memory)
        log.info("%s: a plan of predicted cost %.6g", choice.description, planned.plan.cost)
        if best is None or planned.plan.cost < best.plan.cost:
            best = planned
        if not planned.plan.recomputes:
            break
    if best is None:
        raise min(refusals, key=lambda refusal: refusal.minimum if refusal.minimum is not None else float("inf"))
    best.program.step_function(best.schedule)  # generated now: the Inductor executor compiles its fused runs here
    return best


def _plan_capture(
    model: nn.Module,
    loss_fn: LossFunction,
    batch: Sequence[Any],
    settings: Settings,
    choice: CaptureChoice,
    budget: int | None,
) -> Compiled:
    """Plan one capture of the step within `budget` bytes (None: the settings' budget, resolved against this
    capture's peak without recomputation)."""
    captured, program = prepare_executor(
        settings.executor,
        capture(
            model,
            traced_loss(choice.channels_last, model, loss_fn),
            batch,
            **settings.capture_options,
            **choice.options,
        ),
        model,
        batch,
        settings.cost_model,
    )
    no_remat = solve(captured.graph, None, method="checkpoint_all")
    if budget is None:
        budget = resolve_budget(settings.budget, no_remat.peak_memory)
    log.info(
        "planning %d nodes: no-remat peak %s, budget %s, method %s",
        captured.graph.size,
        format_bytes(no_remat.peak_memory),
        format_bytes(budget),
        settings.method,
    )
    plan = _cached_solve(captured, budget, settings)
    return Compiled(
        captured,
        program,
        plan,
        lower(captured.graph, plan.R, plan.S),
        no_remat,
        parameter_slots=tuple(_slot(model, name) for name in captured.parameter_names),
        buffer_slots=tuple(_slot(model, name) for name in captured.buffer_names),
    )


def _slot(model: nn.Module, qualified_name: str) -> tuple[nn.Module, str]:
    owner, _, name = qualified_name.rpartition(".")
    return model.get_submodule(owner), name


def _cached_solve(captured: Captured, budget: int, settings: Settings) -> Plan:
    key = plan_cache.plan_key(
        captured.graph,
        budget=budget,
        method=settings.method,
        options=settings.solve_options,
        cost_model=captured.cost_model,
        device=captured.device,
    )

    def solved() -> Plan:
        return solve(captured.graph, budget, method=settings.method, **settings.solve_options)

    if not settings.cache:
        return solved()
    return plan_cache.cached_solve(
        key, captured.graph, cost_model=captured.cost_model, options=settings.solve_options, solve=solved
    )


def batch_signature(leaves: list[Any], spec: Any) -> BatchSignature:
    """What a plan is kept by: the batch's pytree spec and each leaf's shape and dtype."""
    shapes = tuple(
        (tuple(leaf.shape), str(leaf.dtype).removeprefix("torch.")) if isinstance(leaf, torch.Tensor) else ((), "?")
        for leaf in leaves
    )
    return (spec, shapes)


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
        if self._settings.capture_options["gradient_memory"] != "when_made":
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
        parameters = [getattr(module, name) for module, name in compiled.parameter_slots]
        buffers = [getattr(module, name) for module, name in compiled.buffer_slots]
        inputs = [p.detach() for p in parameters] + buffers + leaves
        device = parameters[0].device if parameters else torch.device("cpu")
        gradients = self._gradient_sink(compiled, parameters)
        timed = not measure or device.type == "cuda"
        synchronize(device)
        started = time.perf_counter()
        if measure:
            allocator = self._settings.executor == "inductor"
            with measure_peak(device, step_baseline(self.model, leaves), allocator=allocator) as meter:
                outputs = run_schedule(compiled.program, compiled.schedule, inputs, on_gradient=gradients)
                gradients.finish()
                _write_buffers(buffers, outputs.buffer_updates)
            self._measured_peak[self._current] = meter.peak_bytes
            _check_measured_peak(meter.peak_bytes, compiled.plan, device)
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

    def _gradient_sink(self, compiled: Compiled, parameters: Sequence[torch.Tensor]) -> StepGradients:
        """Where this call's gradients go: into `.grad`, as eager autograd adds them."""
        return GradientAccumulator(parameters)

    def report(self) -> StepReport:
        """Planned figures of the current batch shape and, once measured, the live-tensor peak and step time."""
        compiled = self._compiled[self._current]
        plan = compiled.plan
        budget = plan.budget if plan.budget is not None else compiled.no_remat.peak_memory
        overhead = plan.cost / compiled.no_remat.cost - 1.0 if compiled.no_remat.cost > 0 else 0.0
        return StepReport(
            method=plan.method,
            status=plan.status,
            cost_model=compiled.captured.cost_model,
            nodes=compiled.captured.graph.size,
            no_remat_peak=compiled.no_remat.peak_memory,
            budget=budget,
            planned_peak=plan.peak_memory,
            planned_overhead=overhead,
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
