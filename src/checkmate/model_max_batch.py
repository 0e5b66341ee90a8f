"""`checkmate.max_batch` for a model factory (imports torch): the search of `checkmate.experiments.batch_search` on
fake tensors, then its check, which plans the real step at a batch size with `checkmate.compile`.

The search plans on fake tensors, which run no kernel, so its graphs count no kernel scratch; `checkmate.compile`
profiles the real step (its default "profile" cost model) and plans for the scratch it measures. A size the search
found can then fail to compile within the same memory. The check builds the model at a size with the factory and
asks `checkmate.compile` itself for a plan within the memory: a size it passes is one a user's
`checkmate.compile(..., budget=result.memory, **result.compile_options)` plans within the memory. Each compile
leaves its plan in compile's plan cache (when its `cache` is on, the default), and profiling the step at a size runs
it without rematerialization on the model's device, so that size's step must fit the machine.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from checkmate.compile_step import compile as compile_step
from checkmate.errors import InvalidArgument
from checkmate.experiments.batch_search import DEFAULT_LIMIT, MaxBatch, Planned, check_max_batch, search_max_batch
from checkmate.options import FakeCostModel
from checkmate.progress import ProgressCallback
from checkmate.torch_capture.fake_factory import fake_graph_at, training_step

# `checkmate.max_batch` sets these itself: the memory is the budget, and its method is compile's.
OWN_KEYWORDS = ("budget", "method")


def compile_keywords(method: str, options: Mapping[str, Any]) -> dict[str, Any]:
    """The keywords of `checkmate.compile`, besides the budget, that the check plans with: the method, then
    `options` (the method's solve options and compile's own, such as `executor`).

    Raises:
        InvalidArgument: `options` names the budget or the method.
    """
    clashing = sorted(set(options) & set(OWN_KEYWORDS))
    if clashing:
        raise InvalidArgument(
            f"compile options {clashing} are max_batch's own: the memory is compile's budget and `method` its method"
        )
    return {"method": method, **options}


def check_by_compiling(
    found: MaxBatch,
    factory: Callable[..., Any],
    *,
    factory_options: Mapping[str, Any],
    keywords: Mapping[str, Any],
    tolerance: float = 0.0,
    progress: ProgressCallback | None = None,
) -> MaxBatch:
    """`found` checked on the real step: the largest size up to `found.batch_size` whose step
    `checkmate.compile(model, loss_fn, batch, budget=found.memory, **keywords)` plans within the memory
    (`checkmate.experiments.batch_search.check_max_batch`).

    Args:
        found: the search's answer on fake tensors.
        factory: called as `factory(batch_size=n, **factory_options)`, returns `(model, loss_fn, batch)` with real
            tensors on the device the step will run on.
        factory_options: more keyword arguments for the factory.
        keywords: from `compile_keywords`.
        tolerance: as for `checkmate.max_batch`.
        progress: as for `checkmate.max_batch`.

    Raises:
        InfeasibleBudget: not even batch size 1 compiles within the memory.
    """

    def plan_at(batch_size: int) -> Planned:
        model, loss_fn, batch = training_step(factory, batch_size, **factory_options)
        step = compile_step(model, loss_fn, batch, budget=found.memory, **keywords)
        return Planned(step.graph, step.plan)

    return check_max_batch(found, plan_at, dict(keywords), tolerance=tolerance, progress=progress)


def max_batch(
    factory: Callable[..., Any],
    memory: int | str,
    *,
    method: str = "optimal",
    max_extra_forward_passes: float | None = None,
    cost_model: FakeCostModel = "flops",
    factory_options: dict[str, Any] | None = None,
    check: bool = True,
    compile_options: dict[str, Any] | None = None,
    start: int = 1,
    limit: int = DEFAULT_LIMIT,
    tolerance: float = 0.0,
    progress: ProgressCallback | None = None,
    **solve_options: Any,
) -> MaxBatch:
    """The largest `batch_size` for which `method` plans the step of `factory` within `memory` bytes (imports torch).

    Args:
        factory: called as `factory(batch_size=n, **factory_options)`, returns `(model, loss_fn, batch)` like the
            factories of `checkmate.zoo`; the search calls it under a FakeTensorMode (nothing is allocated), the
            check for real.
        memory: bytes, or a size such as "16GiB", fixed memory (parameters, gradients, inputs) included.
        method: a name from `checkmate methods`.
        max_extra_forward_passes: at most this many extra forward passes of compute over the step without
            rematerialization at the same batch size (1.0: the paper's cap for Figure 6); None for no cap.
        cost_model: how the search prices ops on fake tensors: "flops" (the paper's for Figure 6) or "unit".
        factory_options: more keyword arguments for the factory (a width multiplier, a resolution).
        check: plan the real step at the size found with `checkmate.compile` (the model's device, its "profile"
            cost model and kernel scratch unless `compile_options` say otherwise), stepping down while it does not
            fit. This builds the model at that size and runs its step without rematerialization to profile it;
            turn it off for memories this machine cannot hold (a GPU's, for the paper's figures).
        compile_options: more keywords of `checkmate.compile` for the check (`executor`, `gradient_memory`); the
            method and `solve_options` are passed too.
        start: the first size tried, for example the answer of a method this one is known to beat.
        limit: the largest size tried.
        tolerance: stop bisecting once the bracket is within this fraction of the size that fits (0: exact).
        progress: called with `checkmate.progress.Progress` snapshots (the size being tried, the solver's phase).
        **solve_options: options of the method, for each solve and compile (`time_limit`, seconds per solve).

    Raises:
        InfeasibleBudget: not even batch size 1 fits; raise `memory`.
        CaptureError: the factory's step cannot be captured.
        InvalidArgument: `compile_options` names the budget or the method.
    """
    keywords = compile_keywords(method, {**solve_options, **(compile_options or {})})
    found = search_max_batch(
        fake_graph_at(factory, cost_model=cost_model, **(factory_options or {})),
        memory,
        method=method,
        max_extra_forward_passes=max_extra_forward_passes,
        start=start,
        limit=limit,
        tolerance=tolerance,
        progress=progress,
        **solve_options,
    )
    if not check:
        return found
    return check_by_compiling(
        found, factory, factory_options=factory_options or {}, keywords=keywords, tolerance=tolerance, progress=progress
    )
