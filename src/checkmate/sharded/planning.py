"""Planning a sharded step: capture it on the unsharded model, with the fixed memory of the shards, on every rank.

Every unit is gathered for the capture (one all-gather per unit, in unit order on every rank), and the step is
captured on a plain copy of the module tree that shares the gathered parameters and the buffers, without FSDP2's
classes and hooks (FSDP2 modules refuse `copy.deepcopy`, which capture needs, and their hooks would gather and
register autograd functions while tracing). So the captured graph is the same op graph as a single-process step of
the full model. Every unit is freed again afterwards.

The capture counts the full parameters and their gradients in the fixed memory; the sharded step holds only this
rank's shards of them (`Unit.shard_bytes`, `Unit.gradient_shard_bytes`), so the difference is taken out through the
capture's fixed memory (`checkmate.sharded.units.sharding_fixed_memory`).

The budget is the per-rank peak of the sharded step (`checkmate.sharded.memory.sharded_peak`): the plan's graph plus
the gathered parameters, the unsharded gradients and FSDP2's reduce-scatter buffers at the places the step holds
them. A fraction is of that peak without recomputation as the solver counts it (the peak of the step without
recomputation on the graph the solver is given, below), so that `budget=1.0` always admits that step.

Each unit's gathered parameters are a fetched value of the plan's graph (`checkmate.fetched`,
`checkmate.sharded.captured_units.unit_fetches`): the plan decides in which stages each unit is gathered, so whether a
unit is held from its forward to its backward or gathered again, where recomputation gathers it, and (with
prefetching, `Graph.prefetch`) how far ahead each gather starts, are decisions of the same search. Each gather is
priced at its all-gather's time measured on the process group at the first compile and cached, and each unit's release
after its last gradient at its reduce's (FSDP2's post-backward, `checkmate.sharded.link`; with `cost_model="flops"` in
FLOPs at the device's measured matrix-product throughput), and, with prefetching and `ShardedOptions(overlap_gathers)`
(the default), the fraction of a gather that runs beside compute measured as well (the graph's `fetch_overlap`). What a
gather holds beside the parameters (FSDP2's flat all-gather buffer, gloo's copies of it and of the shard) is its fetch's
workspace, counted at the start of the stage of each gather the plan makes, where it runs
(`checkmate.sharded.memory.gather_workspaces`). The step
then gathers and frees each unit where the plan says (`checkmate.sharded.timeline`). What else the units hold
(unsharded gradients, reduce-scatter buffers, the gradient shards made, and a unit's parameters while it reduces) no
plan counts, and it changes only at each unit's REDUCE and at the nodes that make gradients in their own stages: the
solver sees it through the graph's `stage_held` (per stage, the most held at a moment inside it), the workspace of
the node after whose run in its own stage a unit reduces (what the REDUCE holds beyond that) and `opening_held` (what
a REDUCE between two stages holds beyond it, at the next stage's start), as the step without recomputation holds it
(`checkmate.sharded.memory.SolverExtras`). That is exact for every plan whose REDUCEs stay where that step
has them, which holds unless a recomputation reads a unit after its last gradient; the sharded peak of the plan found
is checked, and where it is over the budget the graph is solved again with the plan's own extras counted too: at most
`FIT_ROUNDS` solves, which share the method's `time_limit` (each what the ones before it left).
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import time
from collections.abc import Iterator, Sequence
from typing import Any

import torch.distributed as dist
from torch import nn

import checkmate.sharded.fsdp2 as fsdp2
from checkmate import disk_cache
from checkmate.byte_sizes import format_bytes, resolve_budget
from checkmate.errors import InfeasibleBudget
from checkmate.graph import Graph, Node
from checkmate.plan import schedule_of
from checkmate.sharded.agreement import agree_on_plan
from checkmate.sharded.captured_units import captured_units, unit_fetches
from checkmate.sharded.link import Link, measure_link
from checkmate.sharded.memory import SolverExtras, solver_extras, stage_memory
from checkmate.sharded.units import Unit, shard_bytes_held, sharding_fixed_memory
from checkmate.solve import solve
from checkmate.torch_capture.link_timing import in_cost_unit
from checkmate.torch_capture.trace import LossFunction
from checkmate.training.planning import Compiled, Settings, plan_again, plan_step
from checkmate.training.ranks import on_every_rank

log = logging.getLogger(__name__)


def plan_sharded(
    model: nn.Module,
    units: Sequence[Unit],
    loss_fn: LossFunction,
    batch: Sequence[Any],
    settings: Settings,
    group: Any,
    *,
    prefetch_gathers: bool,
    hold_gathered: bool,
    overlap_gathers: bool,
) -> Compiled:
    """Capture and plan the step of the unsharded model on every rank, and run rank 0's plan everywhere;
    `prefetch_gathers` says whether the step starts each unit's all-gather early (`checkmate.sharded.timeline`),
    `hold_gathered` whether the plan may keep a unit FSDP2 reshards after its forward gathered until its backward,
    `overlap_gathers` whether a prefetched gather is priced as partly hidden behind compute (`gather_overlap`).

    A collective call: every rank of `group` must make it, with a batch of the same shapes.

    Raises:
        RankFailed: planning failed on another rank (that rank raises its own error).
        ShardedTrainingError: the ranks captured different steps.
    """
    device = fsdp2.device(units[0].group)
    with disk_cache.caching(settings.cache):  # `compile(..., cache=False)` reads and writes no cache
        link = measure_link(units, overlap=prefetch_gathers and overlap_gathers)
    log.info(
        "all-gather per unit (%s): %s ms; reduce (post-backward): %s ms; %.0f %% of a gather runs beside compute",
        "cached" if link.cached else "measured",
        ", ".join(f"{1000 * took:.2f}" for took in link.seconds),
        ", ".join(f"{1000 * took:.2f}" for took in link.reduce_seconds),
        100 * link.overlap,
    )
    with gathered(units):
        plain = fsdp2.plain_copy(model)
        gradient_memory = settings.capture.gradient_memory
        held = shard_bytes_held(units, gradient_memory)
        change = sharding_fixed_memory(units, gradient_memory)
        log.info(
            "sharded over %d units: %s of shards in the fixed memory instead of %s",
            len(units),
            format_bytes(held),
            format_bytes(held - change),
        )
        compiled = on_every_rank(
            lambda: _plan_within_budget(
                plain,
                units,
                loss_fn,
                batch,
                settings,
                change,
                hold_gathered,
                link,
                prefetch=prefetch_gathers,
                solves=dist.get_rank(group) == 0,
            ),
            group,
            device,
            what="planning the sharded step",
        )
    return agree_on_plan(compiled, group)


FIT_ROUNDS = 3


def _plan_within_budget(
    plain: nn.Module,
    units: Sequence[Unit],
    loss_fn: LossFunction,
    batch: Sequence[Any],
    settings: Settings,
    fixed_memory: int,
    hold_gathered: bool,
    link: Link,
    *,
    prefetch: bool,
    solves: bool,
) -> Compiled:
    """This rank's plan whose sharded peak fits the budget (see the module doc), its units' gathers priced by `link`
    and prefetched when `prefetch` says (`checkmate.sharded.timeline`); without `solves`, the capture with
    its plan without recomputation, which rank 0's plan then replaces (`checkmate.sharded.agreement`).

    Raises:
        InfeasibleBudget: no plan of the method fits, or none was found within `FIT_ROUNDS` solves.
    """
    planning_started = time.perf_counter()
    no_remat = plan_step(
        plain,
        loss_fn,
        batch,
        dataclasses.replace(settings, budget=1.0, method="checkpoint_all", solve_options={}),
        fixed_memory=fixed_memory,
        generate=False,  # planned again below; `checkmate.sharded` generates the plan's step with its units' calls
    )
    units_of_capture = captured_units(
        no_remat.captured, units, prefetch_gathers=prefetch, gradient_memory=settings.capture.gradient_memory
    )
    graph = no_remat.captured.graph
    if settings.capture.gradient_memory == "when_made":
        graph = _gradients_until_reduce(graph, units_of_capture.sizes.made)
    device = fsdp2.device(units[0].group)
    fetched = unit_fetches(
        units_of_capture.use,
        units_of_capture.sizes,
        graph.size,
        in_cost_unit(link.seconds, settings.capture.cost_model, device),
        in_cost_unit(link.reduce_seconds, settings.capture.cost_model, device),
        released_before_backward=not hold_gathered,
    )
    no_remat = _with_graph(
        no_remat, dataclasses.replace(graph, fetched=fetched, fetch_overlap=link.overlap, prefetch=prefetch)
    )
    if not solves:
        return no_remat
    use, sizes = units_of_capture.use, units_of_capture.sizes
    extras = solver_extras(no_remat.schedule, use, sizes)
    solver_graph = _with_extras(no_remat.captured.graph, extras)
    budget = resolve_budget(settings.budget, solve(solver_graph, None, method="checkpoint_all").peak_memory)
    asked, started = settings.solve_options.get("time_limit"), time.perf_counter()
    for round_number in range(1, FIT_ROUNDS + 1):
        options = settings.solve_options
        if asked is not None:  # the rounds share the time limit
            left = asked - (time.perf_counter() - started)
            if left <= 0:
                break
            options = {**options, "time_limit": left}
        round_settings = dataclasses.replace(settings, solve_options=options)
        planned = plan_again(no_remat, budget, round_settings, solver_graph, planning_started)
        found = stage_memory(planned.schedule, use, sizes)
        log.info(
            "sharded peak %s for a budget of %s (solve %d of at most %d)",
            format_bytes(found.peak),
            format_bytes(budget),
            round_number,
            FIT_ROUNDS,
        )
        if found.peak <= budget:
            return planned
        log.warning(
            "the plan's sharded peak %s is over the budget %s: a unit's reduce is not where the step without "
            "recomputation has it, so the units hold what the solver did not see; solving again with that counted",
            format_bytes(found.peak),
            format_bytes(budget),
        )
        extras = extras.at_least(solver_extras(planned.schedule, use, sizes))
        solver_graph = _with_extras(no_remat.captured.graph, extras)
    raise InfeasibleBudget(
        f"no plan whose sharded peak fits {format_bytes(budget)} was found in {FIT_ROUNDS} solves or the time limit "
        "(a unit's reduce moved by recomputation each time): raise the budget or the time limit",
        budget=budget,
        minimum=None,
    )


def _with_extras(graph: Graph, extras: SolverExtras) -> Graph:
    """`graph` with what the units hold that no plan counts (`checkmate.sharded.memory.SolverExtras`): per stage,
    at stage starts, and right after a node's first run as more of its workspace there."""
    nodes = tuple(
        _with_first_run_workspace(node, extra) for node, extra in zip(graph.nodes, extras.after_own_run, strict=True)
    )
    opening_held = extras.opening_held if any(extras.opening_held) else ()
    return dataclasses.replace(graph, nodes=nodes, stage_held=extras.stage_held, opening_held=opening_held)


def _gradients_until_reduce(graph: Graph, made: Sequence[dict[int, int]]) -> Graph:
    """`graph` not retaining the gradients its nodes make (a capture with `gradient_memory="when_made"` holds each
    to the end of the step): a sharded step holds a unit's unsharded gradients only until its REDUCE, which
    `checkmate.sharded.memory` counts from the moment after the node that makes each; at that node's own moment they
    count in its workspace, as a capture for `.grad`s held through the step counts them."""
    nodes = []
    for node, unsharded in zip(graph.nodes, made, strict=True):
        made_bytes = sum(unsharded.values())
        with_workspace = _with_first_run_workspace(node, made_bytes)
        nodes.append(dataclasses.replace(with_workspace, retained=node.retained - made_bytes) if made_bytes else node)
    return dataclasses.replace(graph, nodes=tuple(nodes))


def _with_first_run_workspace(node: Node, extra: int) -> Node:
    """`node` holding `extra` bytes more while it runs in its own stage, its recomputations as before."""
    if not extra:
        return node
    again = node.workspace if node.recompute_workspace is None else node.recompute_workspace
    return dataclasses.replace(node, workspace=node.workspace + extra, recompute_workspace=again)


def _with_graph(no_remat: Compiled, graph: Graph) -> Compiled:
    """`no_remat` planned again on `graph`, a graph of the same nodes with other sizes or fetched values."""
    plan = solve(graph, None, method="checkpoint_all")
    return dataclasses.replace(
        no_remat,
        captured=dataclasses.replace(no_remat.captured, graph=graph),
        plan=plan,
        no_remat=plan,
        schedule=schedule_of(graph, plan),
    )


@contextlib.contextmanager
def gathered(units: Sequence[Unit]) -> Iterator[None]:
    """Every unit gathered (FSDP2's `unshard`, in unit order), and freed again on leaving."""
    for unit in units:
        unit.module.unshard()
    try:
        yield
    finally:
        for unit in units:
            unit.module.reshard()
