"""Planning a compiled step: capture the step for a batch, resolve the budget, and solve (from the disk cache when
possible), for each capture the executor offers; the plan of least predicted cost is kept.

`plan_step` is what `checkmate.compile` and a step that meets a new batch shape call; the single-process step
(`checkmate.training.compiled`) and the data-parallel one (`checkmate.data_parallel`) both run what it returns.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn
from torch.utils import _pytree as pytree

from checkmate import disk_cache, solving
from checkmate.byte_sizes import format_bytes, parse_budget, resolve_budget
from checkmate.captured import Captured
from checkmate.errors import InfeasibleBudget
from checkmate.execute.linked_graph import with_host_link
from checkmate.execute.program import Program
from checkmate.executors import CaptureChoice, EagerExecutor, Executor
from checkmate.executors.capture_options import CaptureOptions
from checkmate.graph import Graph
from checkmate.options import CostModel, HostOffload, MeasureMemory
from checkmate.plan import Plan, schedule_of
from checkmate.simulate import Schedule
from checkmate.solve import solve
from checkmate.stage_times import Stage, StageTimes, count_capture, recording, timed
from checkmate.strategies.feasibility import in_fraction_of_peak
from checkmate.strategies.held_start import HeldStart
from checkmate.strategies.registry import option_names
from checkmate.torch_capture import capture
from checkmate.torch_capture.trace import LossFunction

log = logging.getLogger(__name__)

BatchSignature = tuple[Any, tuple[tuple[tuple[int, ...], str], ...], tuple[bool, ...]]


@dataclass(frozen=True)
class Settings:
    """How a CompiledStep plans and runs: the budget, the method and its options, the capture options, and what
    `checkmate.compile` says about caching, new batch shapes, measuring, the executor, the layout and moves to host
    memory (`offload`: None allows none).

    `budget` is as given to `compile` until the first plan resolves it; a step keeps it in bytes from then on
    (`in_bytes`), so that every batch shape plans within the same bytes."""

    budget: int | float | str
    method: str
    solve_options: dict[str, Any]
    capture: CaptureOptions
    cache: bool
    replan: bool
    measure_memory: MeasureMemory
    executor: Executor = field(default_factory=EagerExecutor)
    cost_model: CostModel = "profile"
    channels_last: bool | None = None
    planning_time_limit: float | None = None
    offload: HostOffload | None = None


@dataclass(frozen=True)
class Compiled:
    """A step planned for one batch signature.

    `reused_from` is None for a plan made for this signature, else the batch shapes of the planned step whose plan
    (R and S) this one runs (`checkmate.training.shape_reuse`). `stage_times` is where the time of planning it went
    (`plan_step`), None for a plan it did not make.

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
    reused_from: tuple[tuple[tuple[int, ...], str], ...] | None = None
    stage_times: StageTimes | None = None


def in_bytes(settings: Settings, first: Compiled) -> Settings:
    """`settings` with the budget in the bytes `first` (the plan `compile` made) was planned within: a fraction is
    resolved once, against the first capture's peak without recomputation, and every later batch shape plans within
    the same bytes."""
    if first.plan.budget is None:
        return settings
    return dataclasses.replace(settings, budget=first.plan.budget)


def plan_step(
    model: nn.Module,
    loss_fn: LossFunction,
    batch: Sequence[Any],
    settings: Settings,
    *,
    fixed_memory: int = 0,
    generate: bool = True,
) -> Compiled:
    """Capture the step for this batch, resolve the budget and plan it (from the disk cache when possible).
    `fixed_memory` is what a distribution holds beside the model's tensors (`Distribution.fixed_memory`). With
    `generate`, the plan's step function is generated now, not inside a metered step (a distribution that adds
    passes to the program generates it once they are in).

    The executor's captures (`capture_choices`) are prepared in order (captured, priced by the executor), until one
    fits the budget without recomputation. They are then searched cheapest without recomputation first, and one
    whose every-node-once cost is no less than the best plan found already is not searched: its plans cannot be
    cheaper. The plan of least predicted cost is kept. The budget in bytes is resolved once, against the first
    capture's peak without recomputation. When no capture fits, the error names the smallest budget any of them
    could meet. Ctrl-C during a search ends it with its best plan and searches no further capture
    (`checkmate.progress.interrupt_scope`); Ctrl-C during capture raises KeyboardInterrupt. Profiling shows
    progress lines as the search does (`checkmate.progress_lines`), unless the options say `progress`."""
    started = time.perf_counter()
    with recording() as stage_times:
        with solving.planning_scope(settings.solve_options) as interrupted:
            prepared, budget = _prepare_captures(model, loss_fn, batch, settings, fixed_memory)
            best = _search_captures(model, prepared, settings, budget, started, interrupted)
        if generate:
            generate_step_function(best, settings)
        times = stage_times()
    log.info("planned in %s", times)
    return dataclasses.replace(best, stage_times=times)


@dataclass(frozen=True)
class _Prepared:
    """One capture of the step, priced by the executor, and its plan without recomputation."""

    choice: CaptureChoice
    captured: Captured
    program: Program
    no_remat: Plan


def _prepare_captures(
    model: nn.Module, loss_fn: LossFunction, batch: Sequence[Any], settings: Settings, fixed_memory: int
) -> tuple[list[_Prepared], int]:
    """The executor's captures in its order, until one fits the budget without recomputation (a later one is
    prepared only where recomputation is needed, so a loose budget captures once), and the budget in bytes,
    resolved against the first capture's peak without recomputation."""
    prepared: list[_Prepared] = []
    budget = 0
    for choice in settings.executor.capture_choices(settings.channels_last, model):
        count_capture()
        prepared.append(_prepare_capture(model, loss_fn, batch, settings, choice, fixed_memory))
        budget = resolve_budget(settings.budget, prepared[0].no_remat.peak_memory)
        if prepared[-1].no_remat.peak_memory <= budget:
            break
    return prepared, budget


def _search_captures(
    model: nn.Module,
    prepared: list[_Prepared],
    settings: Settings,
    budget: int,
    started: float,
    interrupted: threading.Event,
) -> Compiled:
    """The plan of least predicted cost over the prepared captures within `budget` bytes, searched cheapest without
    recomputation first; a capture whose every-node-once cost is no less than the best plan's is not searched (each
    node runs at least once, at its first-run cost, in every plan).

    Raises:
        InfeasibleBudget: no capture has a plan within `budget` (the one naming the smallest budget that works).
    """
    best: Compiled | None = None
    refusals: list[InfeasibleBudget] = []
    for each in sorted(prepared, key=lambda each: each.no_remat.cost):
        if best is not None and each.no_remat.cost >= best.plan.cost:
            log.info(
                "%s: every node once costs %.6g, no less than the best plan's %.6g: not searched",
                each.choice.description,
                each.no_remat.cost,
                best.plan.cost,
            )
            continue
        try:
            planned = _solve_capture(model, each, settings, budget, started)
        except InfeasibleBudget as refusal:
            log.info("%s: %s", each.choice.description, refusal)
            refusals.append(refusal)
        else:
            log.info("%s: a plan of predicted cost %.6g", each.choice.description, planned.plan.cost)
            if best is None or planned.plan.cost < best.plan.cost:
                best = planned
        if interrupted.is_set():
            break
    if best is None:
        raise min(refusals, key=lambda refusal: refusal.minimum if refusal.minimum is not None else float("inf"))
    return best


def generate_step_function(compiled: Compiled, settings: Settings) -> None:
    """Generate the step function of `compiled`'s schedule with its program's passes (the Inductor executor compiles
    and measures its fused runs here, reading and writing their cache as the settings say)."""
    with disk_cache.caching(settings.cache):
        compiled.program.step_function(compiled.schedule)


def plan_again(compiled: Compiled, budget: int, settings: Settings, graph: Graph, started: float) -> Compiled:
    """The same capture planned again within `budget` bytes with the settings' method (from the disk cache when
    possible), solved on `graph`: the capture's graph with more held outside the plan (a sharded step's units,
    `checkmate.sharded.memory.SolverExtras`). The schedule is lowered on the capture's own graph. `started` is when
    the caller's planning began (`perf_counter`), which `planning_time_limit` counts from.

    Raises:
        InfeasibleBudget: no plan of the method fits `budget`.
    """
    options = _solve_options(settings, started)
    plan = _cached_solve(compiled.captured, budget, settings, options, graph=graph)
    return dataclasses.replace(compiled, plan=plan, schedule=schedule_of(compiled.captured.graph, plan))


def _prepare_capture(
    model: nn.Module,
    loss_fn: LossFunction,
    batch: Sequence[Any],
    settings: Settings,
    choice: CaptureChoice,
    fixed_memory: int,
) -> _Prepared:
    """Capture the step as `choice` says and price it with the settings' executor."""
    options = choice.options(settings.capture)
    with disk_cache.caching(settings.cache):  # profiling and Inductor's measures read and write their own caches
        with timed(Stage.CAPTURE):
            traced = capture(
                model,
                choice.traced_loss(model, loss_fn),
                batch,
                cost_model=options.cost_model,
                max_nodes=options.max_nodes,
                optimizer_state_bytes=fixed_memory,
                gradient_memory=options.gradient_memory,
                fused=options.fused,
                lean_backward=options.lean_backward,
            )
        captured, program = settings.executor.prepare(traced, model, batch, settings.cost_model)
        if settings.offload is not None:
            captured = with_host_link(captured, settings.offload)
    with timed(Stage.SOLVE):
        no_remat = solve(captured.graph, None, method="checkpoint_all")
    return _Prepared(choice, captured, program, no_remat)


def _solve_capture(model: nn.Module, prepared: _Prepared, settings: Settings, budget: int, started: float) -> Compiled:
    """Plan one prepared capture within `budget` bytes; `started` is when the planning began
    (`planning_time_limit`)."""
    captured, no_remat = prepared.captured, prepared.no_remat
    log.info(
        "planning %d nodes (%s): no-remat peak %s, budget %s, method %s",
        captured.graph.size,
        prepared.choice.description,
        format_bytes(no_remat.peak_memory),
        format_bytes(budget),
        settings.method,
    )
    takes_starts = no_remat.peak_memory > budget and "extra_starts" in (option_names(settings.method) or ())

    def extra_starts() -> tuple[HeldStart, ...]:
        return settings.executor.extra_starts(captured, budget) if takes_starts else ()

    try:
        with timed(Stage.SOLVE):
            plan = _cached_solve(captured, budget, settings, _solve_options(settings, started), extra_starts)
    except InfeasibleBudget as error:
        fraction = parse_budget(settings.budget)
        if not isinstance(fraction, float):
            raise
        raise in_fraction_of_peak(error, fraction, no_remat.peak_memory) from None
    return Compiled(
        captured,
        prepared.program,
        plan,
        schedule_of(captured.graph, plan),
        no_remat,
        parameter_slots=tuple(_slot(model, name) for name in captured.parameter_names),
        buffer_slots=tuple(_slot(model, name) for name in captured.buffer_names),
    )


def _slot(model: nn.Module, qualified_name: str) -> tuple[nn.Module, str]:
    owner, _, name = qualified_name.rpartition(".")
    return model.get_submodule(owner), name


def _solve_options(settings: Settings, started: float) -> dict[str, Any]:
    """The method's options for a solve starting now: its `time_limit` cut to what is left of the planning time."""
    return solving.options_within(settings.method, settings.solve_options, settings.planning_time_limit, started)


def _cached_solve(
    captured: Captured,
    budget: int,
    settings: Settings,
    options: dict[str, Any],
    extra_starts: Callable[[], tuple[HeldStart, ...]] = tuple,
    graph: Graph | None = None,
) -> Plan:
    """The plan of `graph` (by default the capture's) within `budget`, from the disk cache when possible; a search
    also starts from `extra_starts()`, made only when it runs."""
    return solving.cached_solve(
        captured.graph if graph is None else graph,
        budget,
        method=settings.method,
        options=options,
        cost_model=captured.cost_model,
        device=captured.device,
        cache=settings.cache,
        extra_starts=extra_starts,
    )


def batch_signature(leaves: list[Any], spec: Any) -> BatchSignature:
    """What a plan is kept by: the batch's pytree spec (`spec`, from flattening the batch into `leaves`), each
    leaf's shape and dtype, and whether it requires a gradient."""
    shapes = tuple(
        (tuple(leaf.shape), str(leaf.dtype).removeprefix("torch.")) if isinstance(leaf, torch.Tensor) else ((), "?")
        for leaf in leaves
    )
    return (spec, shapes, tuple(isinstance(leaf, torch.Tensor) and leaf.requires_grad for leaf in leaves))


def signature_of(batch: Sequence[Any]) -> BatchSignature:
    """The batch signature of `batch` (a tuple of tensors, possibly nested)."""
    return batch_signature(*pytree.tree_flatten(tuple(batch)))
