"""Capture a PyTorch training step as a planning Graph tied to its joint forward + backward fx graph.

    captured = checkmate.capture(model, loss_fn, batch, cost_model="profile")
    plan = checkmate.solve(captured.graph, "2GiB", method="optimal")

Stages, each a function of the previous one's output:

1. `trace.trace_step`: AOTAutograd traces `loss_fn(model, *batch)` and its backward on fake tensors
   into a functional ATen graph (no activation is allocated).
2. `grouping`: views, `getitem`, `detach` and the outputs of multi-output ops join the op that
   allocated their storage, so each planning node is one op that allocates memory.
3. `costs` / `profile`: price each op ("unit", "flops" or "profile").
4. `fusion` (with `fused=True`): ops that Inductor fuses into one kernel become one node.
5. `merge` (when `max_nodes` is given): merge cheap neighbouring nodes.
6. `planning_nodes`: edges, exported values and memory of each planning node, and the fixed memory.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Sequence
from typing import Any

import torch
from torch import nn

from checkmate.captured import Captured
from checkmate.graph import Graph
from checkmate.options import CostModel, GradientMemory, check_choice
from checkmate.torch_capture.costs import check_cost_model, flops_per_op, group_costs, unit_per_op
from checkmate.torch_capture.fusion import fuse_groups
from checkmate.torch_capture.grouping import absorb_short_lived_outputs, assign_groups, find_owners, prepare_graph
from checkmate.torch_capture.lean_backward import lean_backward as rewrite_lean_backward
from checkmate.torch_capture.merge import merge_groups
from checkmate.torch_capture.planning_nodes import PlanningNodes, build_planning_nodes
from checkmate.torch_capture.profile import DEFAULT_REPEATS, OpProfile, ProfileRepeats, profile_per_op
from checkmate.torch_capture.trace import LossFunction, Trace, flatten_batch, trace_step

log = logging.getLogger(__name__)

__all__ = ["capture", "capture_as", "trace_prepared"]


def capture(
    model: nn.Module,
    loss_fn: LossFunction,
    batch: Sequence[Any],
    *,
    cost_model: CostModel = "profile",
    max_nodes: int | None = None,
    optimizer_state_bytes: int = 0,
    gradient_memory: GradientMemory = "whole_step",
    fused: bool = False,
    lean_backward: bool = False,
    profile_repeats: ProfileRepeats = DEFAULT_REPEATS,
) -> Captured:
    """Capture one training step of `model` as a planning graph and the fx graph that executes it.

    Args:
        model: the module to train, on the device where it will run.
        loss_fn: `loss_fn(model, *batch)` returns the scalar loss.
        batch: example inputs (tensors, possibly nested in tuples, lists or dicts); only shapes and
            dtypes matter, except for the "profile" cost model, which runs ops on them.
        cost_model: "profile" (measured seconds per op on the model's device, and each op's kernel scratch
            bytes, counted in its node's workspace; both cached on disk),
            "flops" (PyTorch's FLOP formulas) or "unit" (1 per node).
        max_nodes: merge cheap neighbouring nodes until at most this many remain.
        optimizer_state_bytes: bytes of optimizer state to add to the graph's fixed memory.
        gradient_memory: "whole_step" counts parameter gradients in the fixed memory, for the whole step (a step
            that adds into `.grad`s kept from earlier steps); "when_made" counts each from the node that makes it
            to the end of the step (`.grad`s are None when the step starts, as after `optimizer.zero_grad()`).
        fused: group ops as Inductor fuses them (`checkmate.torch_capture.fusion`): one planning node per fused
            kernel, its inner values not counted. For plans that `checkmate.inductor` runs.
        lean_backward: let ReLU and max-pooling backward read a 1-byte mask and a shape instead of forward tensors
            (`checkmate.torch_capture.lean_backward`): lower floors, more compute.
        profile_repeats: how many runs the "profile" cost model times (`checkmate.torch_capture.profile`).

    Raises:
        CaptureError: the step cannot be traced or planned; the message names the op and the fix.
    """
    check_cost_model(cost_model)
    check_gradient_memory(gradient_memory)
    started = time.perf_counter()
    trace = trace_prepared(model, loss_fn, batch, lean_backward=lean_backward)
    groups = absorb_short_lived_outputs(trace.module.graph, assign_groups(trace.module.graph), trace.loss)
    if fused:
        groups = fuse_groups(trace.module.graph, groups, trace.loss)
    per_op = _per_op_costs(trace, groups, model, batch, cost_model, profile_repeats)
    retain_gradients = gradient_memory == "when_made"
    device = model_device(model)

    def plan_nodes(groups: list[list[str]]) -> PlanningNodes:
        costs = group_costs(groups, per_op.costs)
        scratch = per_op.scratch_bytes
        return _planning_nodes(trace, groups, costs, scratch, optimizer_state_bytes, retain_gradients, device)

    nodes = plan_nodes(groups)
    if max_nodes is not None and nodes.graph.size > max_nodes:
        nodes = plan_nodes(merge_groups(nodes.graph, groups, max_nodes))
    log.info(
        "captured %d planning nodes from %d fx nodes in %.2f s",
        nodes.graph.size,
        len(trace.module.graph.nodes),
        time.perf_counter() - started,
    )
    return _captured(trace, nodes, cost_model, device)


def trace_prepared(
    model: nn.Module, loss_fn: LossFunction, batch: Sequence[Any], *, lean_backward: bool = False
) -> Trace:
    """The joint graph of the step (`trace_step`), with the leaner backward when asked, prepared for grouping
    (`prepare_graph`): the trace `capture` groups and prices. Fake tensors only: nothing runs."""
    trace = trace_step(model, loss_fn, batch)
    if lean_backward:
        rewrite_lean_backward(trace.module)
    prepare_graph(trace.module)
    return trace


def capture_as(
    like: Captured, trace: Trace, *, optimizer_state_bytes: int, gradient_memory: GradientMemory, device: torch.device
) -> Captured:
    """The step of `trace` (`trace_prepared`) in `like`'s planning nodes, priced by `like`'s costs, without measuring
    anything: `like` is a capture of the same step for other batch shapes, and `trace` must have its structure
    (`checkmate.torch_capture.structure.structure_difference`). Sizes are the trace's own. Profiled kernel scratch
    is not measured at this shape: with `like` profiled, each node holds at least `like`'s workspace while it runs
    (the bound for a trace whose sizes are no larger). Recomputations cost what `like`'s do, as first runs do."""
    nodes = _planning_nodes(
        trace,
        [list(names) for names in like.members],
        like.graph.costs.tolist(),
        {},
        optimizer_state_bytes,
        gradient_memory == "when_made",
        device,
    )
    graph = _with_recompute_costs_of(nodes.graph, like.graph)
    if like.cost_model == "profile":
        graph = _with_workspace_of(graph, like.graph)
    return _captured(trace, dataclasses.replace(nodes, graph=graph), like.cost_model, device)


def _with_recompute_costs_of(graph: Graph, like: Graph) -> Graph:
    """`graph` whose nodes' recomputations cost what `like`'s do (as their first runs do)."""
    nodes = [
        dataclasses.replace(node, recompute_cost=priced.recompute_cost)
        for node, priced in zip(graph.nodes, like.nodes, strict=True)
    ]
    return dataclasses.replace(graph, nodes=tuple(nodes))


def _with_workspace_of(graph: Graph, like: Graph) -> Graph:
    """`graph` whose nodes hold at least `like`'s nodes' workspace while they run, first run and recomputation."""
    nodes = []
    for node, workspace, again in zip(graph.nodes, like.workspace, like.recompute_workspace, strict=True):
        first = max(node.workspace, int(workspace))
        recomputed = max(node.workspace if node.recompute_workspace is None else node.recompute_workspace, int(again))
        nodes.append(
            dataclasses.replace(node, workspace=first, recompute_workspace=None if recomputed == first else recomputed)
        )
    return dataclasses.replace(graph, nodes=tuple(nodes))


def _captured(trace: Trace, nodes: PlanningNodes, cost_model: CostModel, device: torch.device) -> Captured:
    return Captured(
        graph=nodes.graph,
        module=trace.module,
        members=nodes.members,
        exports=nodes.exports,
        parameter_names=trace.parameter_names,
        buffer_names=trace.buffer_names,
        batch_shapes=trace.batch_shapes,
        batch_spec=trace.batch_spec,
        loss=trace.loss,
        gradients=trace.gradients,
        buffer_updates=trace.buffer_updates,
        attribute_reads=trace.attribute_reads,
        input_gradients=trace.input_gradients,
        loss_output=trace.loss_output,
        region_outputs=trace.outputs,
        random_nodes=nodes.random_nodes,
        cost_model=cost_model,
        device=str(device),
    )


def check_gradient_memory(gradient_memory: str) -> None:
    """Raise InvalidArgument unless `gradient_memory` is a `GradientMemory` (compile_step.py calls it too)."""
    check_choice("gradient_memory", gradient_memory, GradientMemory)


def model_device(model: nn.Module) -> torch.device:
    """The device of the model's first parameter or buffer (CPU for a stateless model)."""
    for tensor in [*model.parameters(), *model.buffers()]:
        return tensor.device
    return torch.device("cpu")


def _per_op_costs(
    trace: Trace,
    groups: list[list[str]],
    model: nn.Module,
    batch: Sequence[Any],
    cost_model: CostModel,
    repeats: ProfileRepeats,
) -> OpProfile:
    """Cost per fx op, and its scratch bytes (measured by "profile" only; the other cost models run nothing)."""
    if cost_model == "unit":
        return OpProfile(costs=unit_per_op(groups), scratch_bytes={})
    if cost_model == "flops":
        return OpProfile(costs=flops_per_op(trace.module, find_owners(trace.module.graph).allocating), scratch_bytes={})
    state = dict(model.named_parameters()) | dict(model.named_buffers())
    inputs = [state[name] for name in (*trace.parameter_names, *trace.buffer_names)]
    return profile_per_op(trace.module, [*inputs, *flatten_batch(batch)[0]], model_device(model), repeats)


def _planning_nodes(
    trace: Trace,
    groups: list[list[str]],
    costs: Sequence[float],
    scratch: dict[str, int],
    optimizer_state_bytes: int,
    retain_gradients: bool,
    device: torch.device,
) -> PlanningNodes:
    gradients = (*trace.gradients, *trace.input_gradients)
    leaving = (trace.loss, *gradients, *trace.buffer_updates, *trace.outputs)
    return build_planning_nodes(
        trace.module,
        groups,
        costs,
        loss=trace.loss,
        fixed_outputs=frozenset(name for name in leaving if name is not None),
        gradients=frozenset(name for name in gradients if name is not None),
        extra_fixed_memory=optimizer_state_bytes,
        scratch=scratch,
        retain_gradients=retain_gradients,
        random_state_bytes=random_state_bytes(device),
    )


def random_state_bytes(device: torch.device) -> int:
    """Bytes on `device` of the random state the executor saves for a random node: the CPU generator's state (5056
    bytes) on CPU; on CUDA, nothing (the saved states are host tensors)."""
    return int(torch.get_rng_state().numel()) if device.type == "cpu" else 0
