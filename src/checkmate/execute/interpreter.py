"""Run a lowered Schedule over a Captured training step, node by node, like torch.fx.Interpreter.

`prepare(captured)` turns the joint fx graph into one small program per graph node (its member fx
nodes, where each argument comes from, and when each non-exported value dies), generated as Python
source the way torch.fx generates a GraphModule's forward, so running a node costs one call per op
and no interpretation. `run_schedule` then walks the schedule's steps: `Compute(i, t)` runs node i's
members in fx order and keeps its exported values as one more live copy; `Free(i, t)` drops one
copy. Nothing else stays alive, so the live tensors follow the plan's memory model.

Loss, gradients and buffer updates are taken the first time their node runs (stage i of node i) and
never again, so a recomputation cannot count twice. Random nodes save the CPU (and CUDA) generator
state before their first computation and replay it inside `torch.random.fork_rng` when recomputed:
the recomputed masks equal the first ones and the global stream advances exactly as in eager mode.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.fx
from torch.fx.node import map_aggregate

from checkmate.captured import Captured, last_uses
from checkmate.errors import ExecutionError
from checkmate.execute.codegen import NodeFunction, Operation, OperationFailed, Reference, node_function
from checkmate.simulate import Compute, Schedule
from checkmate.torch_capture.strides import conform_layout, traced_stride

log = logging.getLogger(__name__)

GradientSink = Callable[[int, torch.Tensor], None]


@dataclass(frozen=True, slots=True)
class NodeProgram:
    """What computing one graph node means: its operations, what it keeps, and what leaves the step from it."""

    label: str
    operations: tuple[Operation, ...]
    run: NodeFunction
    exports: tuple[str, ...]
    loss: str | None
    gradients: tuple[tuple[int, str], ...]
    buffer_updates: tuple[tuple[int, str], ...]
    random: bool
    taken: frozenset[str]


@dataclass(frozen=True)
class Program:
    """A Captured step compiled for the interpreter."""

    placeholders: tuple[str, ...]
    constants: dict[str, Any]
    nodes: tuple[NodeProgram, ...]
    buffer_count: int


@dataclass(frozen=True)
class StepOutputs:
    """What one run leaves: the detached loss and the new buffer values (None where a buffer is unchanged)."""

    loss: torch.Tensor
    buffer_updates: tuple[torch.Tensor | None, ...]


def prepare(captured: Captured) -> Program:
    """Compile a Captured step into per-node programs, checking that every argument has a source the plan keeps."""
    fx_nodes = {node.name: node for node in captured.module.graph.nodes}
    placeholders = tuple(node.name for node in captured.module.graph.nodes if node.op == "placeholder")
    constants = {
        node.name: _fetch_attribute(captured.module, str(node.target))
        for node in captured.module.graph.nodes
        if node.op == "get_attr"
    }
    if len(captured.members) != captured.graph.size or len(captured.exports) != captured.graph.size:
        raise ExecutionError(
            f"the capture has {len(captured.members)} member lists and {len(captured.exports)} export lists "
            f"for a graph of {captured.graph.size} nodes; they must match"
        )
    owner = {name: index for index, members in enumerate(captured.members) for name in members}
    _check_outputs_owned(captured, owner)
    nodes = tuple(
        _node_program(captured, index, fx_nodes, owner, frozenset(placeholders) | constants.keys())
        for index in range(captured.graph.size)
    )
    return Program(placeholders, constants, nodes, len(captured.buffer_names))


def _fetch_attribute(module: torch.nn.Module, target: str) -> Any:
    return functools.reduce(getattr, target.split("."), module)


def _check_outputs_owned(captured: Captured, owner: dict[str, int]) -> None:
    leaving = [("loss", captured.loss)]
    leaving += [(f"gradient of {p}", g) for p, g in zip(captured.parameter_names, captured.gradients, strict=True) if g]
    leaving += [
        (f"update of buffer {b}", u) for b, u in zip(captured.buffer_names, captured.buffer_updates, strict=True) if u
    ]
    for what, name in leaving:
        if name not in owner:
            raise ExecutionError(f"the {what} is fx value {name!r}, which no graph node computes (not in any members)")


def _node_program(
    captured: Captured, index: int, fx_nodes: dict[str, torch.fx.Node], owner: dict[str, int], always: frozenset[str]
) -> NodeProgram:
    members = captured.members[index]
    label = f"graph node {index} ({captured.graph.nodes[index].name!r})"
    readable = set(always)
    for source in captured.graph.nodes[index].inputs:
        readable.update(captured.exports[source])
    gradients = tuple((p, g) for p, g in enumerate(captured.gradients) if g is not None and owner.get(g) == index)
    updates = tuple((b, u) for b, u in enumerate(captured.buffer_updates) if u is not None and owner.get(u) == index)
    keep = set(captured.exports[index])
    computed = [name for name in members if fx_nodes[name].op == "call_function"]
    missing = keep - set(computed)
    if missing:
        raise ExecutionError(f"{label} exports {sorted(missing)}, which are not among its computed members")
    last_use = last_uses(computed, fx_nodes)
    operations = []
    for position, name in enumerate(computed):
        fx_node = fx_nodes[name]
        for argument in fx_node.all_input_nodes:
            if argument.name not in readable:
                raise ExecutionError(
                    f"{label}: member {name!r} reads fx value {argument.name!r}, which is neither a member computed "
                    "before it, a placeholder, nor an export of one of the node's inputs"
                )
        readable.add(name)
        release = tuple(
            value for value in computed[: position + 1] if last_use[value] == position and value not in keep
        )
        operations.append(_operation(fx_node, release))
    loss = captured.loss if owner[captured.loss] == index else None
    taken = frozenset([loss] if loss else []) | {name for _, name in gradients} | {name for _, name in updates}
    return NodeProgram(
        label=label,
        operations=tuple(operations),
        run=node_function(label, tuple(operations), taken, conform=_conform_layout),
        exports=tuple(captured.exports[index]),
        loss=loss,
        gradients=gradients,
        buffer_updates=updates,
        random=index in captured.random_nodes,
        taken=taken,
    )


def _operation(fx_node: torch.fx.Node, release: tuple[str, ...]) -> Operation:
    def to_reference(value: Any) -> Any:
        return Reference(value.name) if isinstance(value, torch.fx.Node) else value

    args = tuple(map_aggregate(fx_node.args, to_reference))
    kwargs = dict(map_aggregate(dict(fx_node.kwargs), to_reference))
    if not callable(fx_node.target):
        raise ExecutionError(f"fx node {fx_node.name!r} has target {fx_node.target!r}, which is not callable")
    function = fx_node.target._op if isinstance(fx_node.target, torch._ops.OpOverload) else fx_node.target
    return Operation(fx_node.name, fx_node.target, function, args, kwargs, release, traced_stride(fx_node))


def _conform_layout(tensor: torch.Tensor, stride: tuple[int, ...], name: str) -> torch.Tensor:
    """The value in its traced layout (`checkmate.torch_capture.strides`); a copy, held beside the original for a
    moment, that the plan does not count: logged once per fx node."""
    laid_out = conform_layout(tensor, stride)
    if laid_out is not tensor and name not in _layouts_warned:
        _layouts_warned.add(name)
        log.warning(
            "fx node %r came out with strides %s where the trace had %s: copied into the traced layout, holding "
            "%d bytes more than the plan counts for a moment",
            name,
            tuple(tensor.stride()),
            stride,
            tensor.numel() * tensor.element_size(),
        )
    return laid_out


_layouts_warned: set[str] = set()


def run_schedule(
    program: Program, schedule: Schedule, inputs: Sequence[Any], *, on_gradient: GradientSink
) -> StepOutputs:
    """Run one training step exactly as `schedule` says.

    Args:
        program: the step, from `prepare(captured)`.
        schedule: `lower(captured.graph, plan.R, plan.S)`.
        inputs: live tensors in placeholder order: parameters (detached), buffers, flattened batch.
        on_gradient: called as on_gradient(parameter_index, gradient) as soon as a gradient is computed.

    Returns:
        The detached loss and the buffers' new values.

    Raises:
        ExecutionError: an operation failed; the message names the graph node, the stage and the fx node.
    """
    if len(inputs) != len(program.placeholders):
        raise ExecutionError(f"the step takes {len(program.placeholders)} inputs, got {len(inputs)}")
    run = _Run(program, inputs, on_gradient)
    with torch.no_grad():
        for step in schedule.steps:
            if isinstance(step, Compute):
                run.compute(step.node, step.stage)
            else:
                run.free(step.node)
    if run.loss is None:
        raise ExecutionError("the schedule never computed the loss node")
    return StepOutputs(run.loss, tuple(run.buffer_updates))


class _Run:
    """The mutable state of one step: the environment of live values and the copies the plan holds."""

    def __init__(self, program: Program, inputs: Sequence[Any], on_gradient: GradientSink) -> None:
        self.program = program
        self.env: dict[str, Any] = dict(zip(program.placeholders, inputs, strict=True))
        self.env.update(program.constants)
        self.copies: dict[int, list[tuple[Any, ...]]] = {}
        self.rng_states: dict[int, tuple[torch.Tensor, list[torch.Tensor]]] = {}
        self.cuda_devices = sorted({t.device.index or 0 for t in inputs if isinstance(t, torch.Tensor) and t.is_cuda})
        self.on_gradient = on_gradient
        self.loss: torch.Tensor | None = None
        self.buffer_updates: list[torch.Tensor | None] = [None] * program.buffer_count

    def compute(self, index: int, stage: int) -> None:
        node = self.program.nodes[index]
        first = stage == index
        if node.random and first:
            self.rng_states[index] = (torch.get_rng_state(), [torch.cuda.get_rng_state(d) for d in self.cuda_devices])
        if node.random and not first:
            with torch.random.fork_rng(devices=self.cuda_devices):
                cpu_state, cuda_states = self.rng_states[index]
                torch.set_rng_state(cpu_state)
                for device, state in zip(self.cuda_devices, cuda_states, strict=True):
                    torch.cuda.set_rng_state(state, device)
                self._evaluate(node, stage, first)
        else:
            self._evaluate(node, stage, first)
        if not first:
            self._share_step_outputs(node)
        self.copies.setdefault(index, []).append(tuple(self.env[name] for name in node.exports))

    def _share_step_outputs(self, node: NodeProgram) -> None:
        """A recomputation makes the step's outputs again, with the same values. Exported ones (BatchNorm's new
        running statistics, which its backward reads) are swapped for the first run's tensors: the plan counts
        those once, in the fixed memory, and the new ones die with the node, as its recompute workspace says."""
        for buffer, update in node.buffer_updates:
            if update in node.exports:
                self.env[update] = self.buffer_updates[buffer]
        if node.loss is not None and node.loss in node.exports:
            self.env[node.loss] = self.loss

    def _evaluate(self, node: NodeProgram, stage: int, first: bool) -> None:
        try:
            node.run(self.env, functools.partial(self._take, node) if first and node.taken else None)
        except OperationFailed as failure:
            operation = node.operations[failure.position]
            raise ExecutionError(
                f"{node.label}, stage {stage}: fx node {operation.name!r} ({operation.target}) failed: {failure.error}"
            ) from failure.error

    def _take(self, node: NodeProgram, name: str) -> None:
        if name == node.loss:
            self.loss = self.env[name].detach()
        for parameter, gradient in node.gradients:
            if gradient == name:
                self.on_gradient(parameter, self.env[name])
        for buffer, update in node.buffer_updates:
            if update == name:
                self.buffer_updates[buffer] = self.env[name]

    def free(self, index: int) -> None:
        held = self.copies.get(index)
        if not held:
            raise ExecutionError(f"the schedule frees {self.program.nodes[index].label}, which holds no live copy")
        held.pop(0)
        if not held:
            for name in self.program.nodes[index].exports:
                del self.env[name]
