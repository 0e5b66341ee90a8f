"""Running a new batch shape on the plan of a larger one, without planning: no profiling and no solve.

A smaller last batch, or a shorter sequence, would otherwise stall the step for a full capture and solve. When a
planned batch is at least as large in every dimension (same batch structure, dtypes and number of dimensions), the
new batch is traced on fake tensors (cheap: nothing runs), and when its trace has the planned one's structure
(`checkmate.torch_capture.structure.structure_difference`), it is laid out in the planned step's nodes, priced by
their costs (`checkmate.torch_capture.capture_as`). The planned R, S and moves to host memory are then a schedule of
it (on the planned step's host link); the simulator prices its memory at the new sizes, and it runs when its peak
fits the budget. Otherwise the caller plans the shape as `compile` does.

The reused plan is valid and fits, but it was made for the larger shape: `CompiledStep.improve` plans the shape for
itself on request. Not in the background: planning traces the live model while the optimizer updates it, and
profiling runs every op on the device the training loop is using.

The eager executor only: the Inductor executor compiles and measures each shape's nodes, which is the planning's
cost itself.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterable, Sequence
from typing import Any

from torch import nn

from checkmate.byte_sizes import format_bytes, resolve_budget
from checkmate.execute.program import prepare
from checkmate.plan import make_plan, schedule_of
from checkmate.solve import solve
from checkmate.torch_capture import capture_as, model_device, trace_prepared
from checkmate.torch_capture.structure import structure_difference
from checkmate.torch_capture.trace import LossFunction
from checkmate.training.planning import BatchSignature, Compiled, Settings, signature_of

Shapes = tuple[tuple[tuple[int, ...], str], ...]


def reuse_plan(
    model: nn.Module,
    loss_fn: LossFunction,
    batch: Sequence[Any],
    settings: Settings,
    planned: Iterable[Compiled],
    *,
    fixed_memory: int = 0,
) -> Compiled | str:
    """The step of `batch` running the plan of the smallest planned step at least as large in every dimension, when
    its trace has that step's structure and the plan's peak at this batch's sizes fits the budget (`settings.budget`,
    in bytes); else why not, for the log.

    Nothing runs on the device: the batch is traced on fake tensors and the plan is simulated.
    """
    if not settings.executor.reuses_plans_across_shapes:
        return f"the {settings.executor.name!r} executor compiles each shape's nodes"
    signature = signature_of(batch)
    covering = [compiled for compiled in planned if compiled.reused_from is None and _covers(compiled, signature)]
    if not covering:
        return "no planned batch is as large in every dimension"
    like = min(covering, key=lambda compiled: _elements(compiled.captured.batch_shapes))
    choice = settings.executor.capture_choices(settings.channels_last, model)[0]
    trace = trace_prepared(model, choice.traced_loss(model, loss_fn), batch, lean_backward=False)
    difference = structure_difference(like.captured, trace)
    if difference is not None:
        return f"its graph differs from that of batch {describe(like.captured.batch_shapes)}: {difference}"
    captured = capture_as(
        like.captured,
        trace,
        optimizer_state_bytes=fixed_memory,
        gradient_memory=settings.capture.gradient_memory,
        device=model_device(model),
    )
    # the same device, link and host budget: the planned step's moves run at this batch's sizes too
    captured = dataclasses.replace(
        captured, graph=dataclasses.replace(captured.graph, host_link=like.captured.graph.host_link)
    )
    budget = resolve_budget(settings.budget, like.no_remat.peak_memory)
    plan = make_plan(
        captured.graph,
        like.plan.R,
        like.plan.S,
        method=like.plan.method,
        budget=budget,
        presence=like.plan.presence,
        moves=like.plan.moves,
    )
    if plan.peak_memory > budget:
        return (
            f"the plan of batch {describe(like.captured.batch_shapes)} holds {format_bytes(plan.peak_memory)} at "
            f"this batch's sizes, over the budget of {format_bytes(budget)}"
        )
    schedule = schedule_of(captured.graph, plan)
    program = prepare(captured)
    program.step_function(schedule)  # generated now, as plan_step does, not inside a metered step
    return Compiled(
        captured,
        program,
        plan,
        schedule,
        solve(captured.graph, None, method="checkpoint_all"),
        parameter_slots=like.parameter_slots,
        buffer_slots=like.buffer_slots,
        reused_from=like.captured.batch_shapes,
    )


def describe(shapes: Shapes, requires_grad: Sequence[bool] = ()) -> str:
    """Batch shapes as the log and errors write them: `float32[256, 64] requiring grad, int64[256]`."""
    marks = [" requiring grad" if flag else "" for flag in requires_grad] or [""] * len(shapes)
    return ", ".join(f"{dtype}{list(shape)}{mark}" for (shape, dtype), mark in zip(shapes, marks, strict=True))


def _covers(compiled: Compiled, signature: BatchSignature) -> bool:
    """Whether `compiled`'s batch has `signature`'s structure, dtypes and dimensions, each at least as large."""
    spec, shapes, _ = signature  # whether batch tensors require grad: `structure_difference` compares their gradients
    planned = compiled.captured.batch_shapes
    return (
        compiled.captured.batch_spec == spec
        and len(planned) == len(shapes)
        and all(
            dtype == old_dtype
            and len(shape) == len(old)
            and all(new <= size for new, size in zip(shape, old, strict=True))
            for (shape, dtype), (old, old_dtype) in zip(shapes, planned, strict=True)
        )
    )


def _elements(shapes: Shapes) -> int:
    return sum(math.prod(shape) for shape, _ in shapes)
