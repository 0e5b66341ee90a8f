"""`checkmate.compile`: capture a training step, plan it within a memory budget, and run it as planned.

    step = checkmate.compile(model, loss_fn, batch, budget=0.5, method="optimal", time_limit=60)
    loss = step(*batch)          # forward + backward by the plan; .grad filled as loss.backward() would
    optimizer.step(); optimizer.zero_grad()
    print(step.report())

This module checks the arguments, resolves the executor (`checkmate.executors`) and the distribution, plans the
step (`checkmate.training.planning`) and returns the `checkmate.training.compiled.CompiledStep` that runs the plan.
The distribution is the single process, or for a DistributedDataParallel model `checkmate.data_parallel.DataParallel`
(DDP's gradient all-reduce), or for a model sharded with FSDP2's `fully_shard` `checkmate.sharded.Sharded` (FSDP2's
gathers and reduce-scatters).
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from typing import Any

from torch import nn

from checkmate.byte_sizes import parse_budget
from checkmate.data_parallel import compile_data_parallel
from checkmate.errors import InvalidArgument
from checkmate.executors import executor_named
from checkmate.moved import LinkSpeeds
from checkmate.options import (
    CostModel,
    ExecutorName,
    GradientMemory,
    MeasureMemory,
    ShardedOptions,
    check_choice,
    host_offload,
)
from checkmate.search_defaults import with_search_defaults
from checkmate.solve import check_solve_options
from checkmate.solving import check_planning_time_limit
from checkmate.torch_capture.trace import LossFunction
from checkmate.training.compiled import CompiledStep
from checkmate.training.distribution import SingleProcess
from checkmate.training.planning import Settings, plan_step, signature_of


def compile(
    model: nn.Module,
    loss_fn: LossFunction,
    batch: Sequence[Any],
    *,
    budget: int | float | str,
    method: str = "optimal",
    cost_model: CostModel = "profile",
    max_nodes: int | None = None,
    cache: bool = True,
    replan: bool = True,
    measure_memory: MeasureMemory = "first",
    gradient_memory: GradientMemory = "whole_step",
    executor: ExecutorName = "eager",
    channels_last: bool | None = None,
    planning_time_limit: float | None = None,
    sharded: ShardedOptions | None = None,
    host_budget: int | str | None = None,
    host_link: LinkSpeeds | None = None,
    **solve_options: Any,
) -> CompiledStep:
    """Plan `loss_fn(model, *batch)` and its backward within `budget`, and return a step that runs that plan.

    Args:
        model: the module to train, on the device it will run on; or a DistributedDataParallel wrapping it, whose
            gradients the step then all-reduces as DDP does (`checkmate.data_parallel`; every rank must call); or a
            module with FSDP2's `fully_shard` applied to its blocks and its root, whose units the step gathers and
            reduces as FSDP2 does (`checkmate.sharded`; every rank must call, with batches of one shape).
        loss_fn: `loss_fn(model, *batch)` returns the scalar loss.
        batch: an example batch (a tuple of tensors, possibly nested); its shapes and dtypes are planned for.
        budget: bytes (an int or a string such as "8GiB"), or a float in (0, 1]: that fraction of the
            peak with no recomputation (the `checkpoint_all` plan) of `batch`, resolved to bytes once, here: every
            later batch shape plans within the same bytes. Fixed memory (parameters, gradients, buffers, batch) is
            included.
        method: a strategy name from `checkmate methods`, such as "optimal", "chen_greedy" or "checkpoint_all".
        cost_model: how capture prices ops: "profile", "flops" or "unit".
        max_nodes: let capture merge cheap neighbouring nodes until at most this many remain (faster solves).
        cache: reuse plans and op measurements cached on disk (`$CHECKMATE_CACHE_DIR`, default
            `~/.cache/checkmate`); with False nothing is read from or written to the disk caches. A cache that cannot
            be written, or a damaged entry, is logged as a warning and costs only time.
        replan: plan a batch of a new shape when it arrives; with False such a batch raises ExecutionError. A batch
            no larger in any dimension than a planned one, whose graph has the same structure, runs that plan at once
            where it fits the budget, without profiling or solving (`checkmate.training.shape_reuse`; the log says
            so); `step.improve(*batch)` plans its shape for itself.
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
            CPU oneDNN's channels-last convolutions round differently, further from float64 than contiguous ones
            (`checkmate.torch_capture.channels_last`). None (the default) is False for the eager executor; the
            Inductor one plans channels-last first and its own layout next when the first plan does not fit or
            recomputes, and runs the plan of least predicted cost (`checkmate.training.planning.plan_step`).
        sharded: for a model sharded with FSDP2, whether units are held gathered from forward to backward where
            the budget has room, and whether their all-gathers are prefetched (`checkmate.options.ShardedOptions`;
            None: both).
        host_budget: let the plan move values to host memory and back beside recomputing them, holding at most this
            many bytes there (an int, or a string such as "64GiB"): copies out after the forward makes a value and back
            before the backward reads it, run beside compute and priced at the link's measured speed
            (`checkmate.moved`, `checkmate.execute.host_copies`). None (the default): no moves, unless `host_link`
            is given (then host memory is not limited). Moves are decided by the "optimal" method.
        host_link: the link's speeds for planning moves (`checkmate.moved.LinkSpeeds`: bytes per second each way,
            seconds per copy, the fraction of a copy hidden behind compute); None: measured on the model's device at
            the first compile and cached.
        planning_time_limit: seconds for all the planning of a batch shape: capture, profiling and every solve (the
            Inductor executor may plan several captures). Each solve gets what is left of it, or its own
            `time_limit` if that is less. Capture and profiling cannot be interrupted: when they take all of it, the
            solve gets no time, and `compile` raises InfeasibleBudget unless its first baselines fit. None (the
            default): no limit beyond each solve's `time_limit`.
        **solve_options: options of the method, such as `time_limit=60`. `time_limit` bounds the search only: capture,
            profiling (a first capture of a large model profiles every op, which can take minutes on CPU) and generating
            the step's code are outside it; `planning_time_limit` bounds them all. For "optimal" and "approx" the time
            limit defaults to DEFAULT_TIME_LIMIT (`checkmate.search_defaults`) so that a first call cannot hang, and
            "optimal" stops once its plan is proven within DEFAULT_GAP of its lower bound (`mip_gap`; pass
            `mip_gap=1e-4` to search on), or once that gap has not closed for DEFAULT_STALL_TIME seconds
            (`stall_time`; None to search on). The plan is the best found; `step.plan.status` is "optimal" only when its
            lower bound meets its cost, and `step.plan.gap` says how close it is otherwise. Profiling and the search
            show a progress line every 5 s (`progress_interval`) on stderr (in the log, when the program configures
            logging); `progress=False`, or a level above INFO on the "checkmate" logger, silences them
            (`checkmate.progress_lines`). Ctrl-C during the search ends it with the best plan so far (cached with the
            seconds it searched); Ctrl-C again, or during capture, raises KeyboardInterrupt.

    Returns:
        A CompiledStep; call it with a batch.

    Raises:
        CaptureError: the model cannot be captured.
        DataParallelError: a DistributedDataParallel uses a setting the step does not reproduce.
        ShardedTrainingError: an FSDP2 model uses a feature the step does not reproduce (`checkmate.sharded`).
        RankFailed: another rank failed to compile a data-parallel or sharded step.
        InfeasibleBudget: no plan of `method` fits the budget; the error names the smallest it could meet.

    Example:
        >>> step = checkmate.compile(model, loss_fn, (x, y), budget=0.5, time_limit=30)
        >>> loss = step(x, y)
    """
    parse_budget(budget)
    check_choice("cost_model", cost_model, CostModel)
    check_choice("gradient_memory", gradient_memory, GradientMemory)
    check_choice("measure_memory", measure_memory, MeasureMemory)
    chosen = executor_named(executor)
    check_solve_options(method, solve_options)
    solve_options = with_search_defaults(method, solve_options)
    check_planning_time_limit(planning_time_limit)
    offload = host_offload(host_budget, host_link)
    settings = Settings(
        budget=budget,
        method=method,
        solve_options=dict(solve_options),
        capture=chosen.capture_options(cost_model, max_nodes=max_nodes, gradient_memory=gradient_memory),
        cache=cache,
        replan=replan,
        measure_memory=measure_memory,
        executor=chosen,
        cost_model=cost_model,
        channels_last=channels_last,
        planning_time_limit=planning_time_limit,
        offload=offload,
    )
    sharded_model = _is_sharded(model)
    if sharded is not None and not sharded_model:
        raise InvalidArgument(
            "sharded= places the units of a model sharded with FSDP2's fully_shard, and this model has none: leave it "
            "out, or apply fully_shard to the model's blocks and its root"
        )
    if isinstance(model, nn.parallel.DistributedDataParallel):
        return compile_data_parallel(model, loss_fn, batch, settings)
    if sharded_model:
        from checkmate.sharded import compile_sharded  # heavy: FSDP2 and DTensor are slow to import

        return compile_sharded(model, loss_fn, batch, settings, sharded or ShardedOptions())
    compiled = plan_step(model, loss_fn, batch, settings)
    return CompiledStep(model, loss_fn, settings, {signature_of(batch): compiled}, SingleProcess(model))


def _is_sharded(model: nn.Module) -> bool:
    """Whether FSDP2's `fully_shard` was applied to `model` or a submodule, without importing FSDP2 where nothing has
    (a sharded model has imported it)."""
    fsdp = sys.modules.get("torch.distributed.fsdp")
    return fsdp is not None and any(isinstance(module, fsdp.FSDPModule) for module in model.modules())
