"""A Captured training step as a Program to run, and running a lowered Schedule over it as one generated function.

`prepare(captured)` turns the joint fx graph into one small program per graph node: its member fx nodes, where
each argument comes from, and when each non-exported value dies. `run_schedule` then runs the schedule's steps:
`Compute(i, t)` runs node i's members in fx order and keeps its exported values as one more live copy; `Free(i, t)`
drops the oldest copy. Nothing else stays alive, so the live tensors follow the plan's memory model.

The steps are not interpreted one by one: `checkmate.execute.codegen` writes the whole schedule as one straight-line
Python function (every step in order, every operation inlined, values in local variables), generated once per
schedule and kept in the Program (`Program.step_function`), so a step costs one Python call per op and nothing
per Compute or Free. The codegen module docstring spells out the semantics it keeps: loss, gradients and buffer
updates taken on a node's first computation only, random nodes replayed on recomputation, layouts conformed.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import weakref
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.fx
from torch.fx.node import map_aggregate

from checkmate.captured import Captured, last_uses
from checkmate.errors import ExecutionError
from checkmate.execute.codegen import (
    GradientSink,
    NodeProgram,
    Operation,
    Reference,
    ScheduleItem,
    StepFunction,
    StepSource,
    step_function,
)
from checkmate.execute.host_copies import HostMoves
from checkmate.execute.passes import SchedulePass, apply_passes
from checkmate.simulate import Schedule
from checkmate.torch_capture.strides import conform_layout, traced_stride

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Program:
    """A Captured step compiled for execution, and the step functions generated from it so far.

    `step_functions` maps id(schedule) to (a weak reference to the schedule, its function, the steps it runs): a
    schedule is generated once and its function dropped once the schedule is gone (a plan replaced by `use_plan`).
    `passes` rewrite a schedule's steps before its function is generated, by their order
    (`checkmate.execute.passes`): an executor's fusion of runs, a distribution's calls among the steps.
    """

    placeholders: tuple[str, ...]
    constants: dict[str, Any]
    nodes: tuple[NodeProgram, ...]
    buffer_count: int
    output_count: int = 0
    passes: tuple[SchedulePass, ...] = field(default=(), compare=False)
    step_functions: dict[int, tuple[weakref.ref[Schedule], StepFunction, tuple[ScheduleItem, ...]]] = field(
        default_factory=dict, repr=False, compare=False
    )

    def lowered(self, schedule: Schedule) -> tuple[ScheduleItem, ...]:
        """The steps the step function of `schedule` runs: its own, rewritten by this program's passes (applied
        again: `run_steps` gives those of the function generated)."""
        return apply_passes(schedule, self.passes)

    def run_steps(self, schedule: Schedule) -> tuple[ScheduleItem, ...]:
        """The steps `step_function(schedule)` runs (generating it when it is not yet)."""
        self.step_function(schedule)
        return self.step_functions[id(schedule)][2]

    def with_passes(self, *passes: SchedulePass) -> Program:
        """This program with `passes` added to its own (its step functions generated anew)."""
        return dataclasses.replace(self, passes=(*self.passes, *passes), step_functions={})

    def step_function(self, schedule: Schedule) -> StepFunction:
        """The function that runs `schedule` over this program, generated on the first call for that schedule.

        Raises:
            ExecutionError: the schedule frees a node that holds no live copy, or never computes the loss.
        """
        cached = self.step_functions.get(id(schedule))
        if cached is not None and cached[0]() is schedule:
            return cached[1]
        steps = self.lowered(schedule)
        source = StepSource(
            self.nodes,
            self.placeholders,
            self.constants,
            self.buffer_count,
            steps,
            _conform_layout,
            output_count=self.output_count,
        )
        function = step_function(source)
        for key in [key for key, (reference, *_) in self.step_functions.items() if reference() is None]:
            del self.step_functions[key]
        self.step_functions[id(schedule)] = (weakref.ref(schedule), function, steps)
        return function


@dataclass(frozen=True)
class StepOutputs:
    """What one run leaves: the detached loss, the new buffer values (None where a buffer is unchanged) and the step's
    other outputs (`Captured.region_outputs`), detached."""

    loss: torch.Tensor
    buffer_updates: tuple[torch.Tensor | None, ...]
    outputs: tuple[torch.Tensor, ...] = ()


def prepare(captured: Captured) -> Program:
    """Compile a Captured step into per-node programs, checking that every argument has a source the plan keeps."""
    fx_nodes = {node.name: node for node in captured.module.graph.nodes}
    placeholders = tuple(node.name for node in captured.module.graph.nodes if node.op == "placeholder")
    constants = {
        node.name: fetch_attribute(captured.module, str(node.target))
        for node in captured.module.graph.nodes
        if node.op == "get_attr"
    }
    if len(captured.members) != captured.graph.size or len(captured.exports) != captured.graph.size:
        raise ExecutionError(
            f"the capture has {len(captured.members)} member lists and {len(captured.exports)} export lists "
            f"for a graph of {captured.graph.size} nodes; they must match"
        )
    owner = captured.node_of
    _check_outputs_owned(captured, owner)
    nodes = tuple(
        _node_program(captured, index, fx_nodes, owner, frozenset(placeholders) | constants.keys())
        for index in range(captured.graph.size)
    )
    return Program(
        placeholders,
        constants,
        nodes,
        len(captured.buffer_names),
        len(captured.region_outputs),
        passes=(HostMoves(),),
    )


def fetch_attribute(module: torch.nn.Module, target: str) -> Any:
    """The module's attribute at a dotted fx `get_attr` target, such as "layer.weight"."""
    return functools.reduce(getattr, target.split("."), module)


def _check_outputs_owned(captured: Captured, owner: dict[str, int]) -> None:
    leaving = [("loss", captured.loss)]
    leaving += [(f"gradient of {p}", g) for p, g in zip(captured.parameter_names, captured.gradients, strict=True) if g]
    leaving += [(f"gradient of batch tensor {b}", g) for b, g in enumerate(captured.input_gradients) if g]
    leaving += [(f"output {o} of loss_fn", name) for o, name in enumerate(captured.region_outputs)]
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
    made = (*captured.gradients, *captured.input_gradients)
    gradients = tuple((p, g) for p, g in enumerate(made) if g is not None and owner.get(g) == index)
    outputs = tuple((o, name) for o, name in enumerate(captured.region_outputs) if owner.get(name) == index)
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
    return NodeProgram(
        label=label,
        operations=tuple(operations),
        exports=tuple(captured.exports[index]),
        loss=loss,
        gradients=gradients,
        buffer_updates=updates,
        outputs=outputs,
        random=index in captured.random_nodes,
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
        schedule: `schedule_of(captured.graph, plan)`.
        inputs: live tensors in placeholder order: parameters (detached), buffers, flattened batch.
        on_gradient: called as on_gradient(index, gradient) as soon as a gradient is computed: the index of a
            parameter, or the parameter count plus the index of a batch tensor (`Captured.input_gradients`).

    Returns:
        The detached loss, the buffers' new values and the step's other outputs.

    Raises:
        ExecutionError: an operation failed (the message names the graph node, the stage and the fx node), or the
            schedule cannot run (it frees a node with no live copy, or never computes the loss).
    """
    if len(inputs) != len(program.placeholders):
        raise ExecutionError(f"the step takes {len(program.placeholders)} inputs, got {len(inputs)}")
    function = program.step_function(schedule)
    with torch.no_grad():
        loss, buffer_updates, outputs = function(inputs, on_gradient)
    return StepOutputs(loss, buffer_updates, outputs)
