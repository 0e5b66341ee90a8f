"""Generate one straight-line Python function that runs a whole schedule, as torch.fx generates a GraphModule's forward.

The function runs every `Compute` and `Free` step of the schedule in order, with each graph node's operations
inlined and each fx value in a local variable:

    def step(inputs, on_gradient):
        v_x, v_w, = inputs
        loss = None
        try:
            # Compute(0, 0): graph node 0 ('mm')
            v_mm = f0(v_x, v_w)
            # Compute(1, 1): graph node 1 ('sum'): the loss, taken on its first computation
            v_sum = f1(v_mm)
            loss = v_sum.detach()
            # Free(0, 1)
            del v_mm
            ...
        except Exception as error:
            ...  # ExecutionError naming the graph node, the stage and the fx node of the failing line
        return loss, ()

Targets and constant arguments are bound by name (`f0`, `c0`, `s0`) in the function's globals, never printed as
literals. Compared with calling one function per step from a loop over the schedule, this saves the dispatch, the
environment dict and the per-step bookkeeping: a few microseconds per step, most of what a Python executor adds to
eager PyTorch.

The memory model (`checkmate.simulate`) is kept exactly: a local holds a value from its computation to the `del`
where the schedule drops it, and nothing else refers to it.

* Inside a node, a member that is not exported dies right after its last use (`Operation.release`).
* A node's exported values form one live copy; a `Free` drops the oldest copy of that node. When the schedule
  computes a node again while a copy is still held, the held copy's values move to a tuple (`held_3_0`) first, so
  both stay alive; a `Free` then deletes the oldest tuple, and the locals themselves (the newest copy, the one
  consumers read) only when no other copy is left.
* The loss and the step's other outputs (detached), the gradients (handed to `on_gradient(index, tensor)`) and the
  buffer updates are taken right after they are made, on the node's first computation only (stage == node), so a
  recomputation cannot count twice. A recomputation that exports one of them swaps the first run's tensor in: the
  plan counts that tensor once, in the fixed memory, and the recomputed one dies with the node.
* A random node that the schedule computes again saves the CPU (and CUDA) generator state before its first
  computation (the plan counts that state as retained by every random node) and replays it when recomputed
  (`checkmate.execute.random_replay`): the recomputed masks equal the first ones and the global stream advances
  exactly as in eager mode.
* A value with a traced stride that came out laid out otherwise is replaced by `conform(value, stride, name)`.
* A `SegmentCall` (the Inductor executor's fused run of steps) is one call of a compiled function on a list of its
  arguments: the values of the nodes it frees are deleted from the locals first, so they die inside the call after
  their last use, and its results are unpacked into the locals of the nodes that stay live.

Failures carry no per-operation bookkeeping: the failing source line (the traceback's line in the generated frame)
maps to the operation, its graph node and stage.
"""

from __future__ import annotations

import collections
import functools
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from checkmate.errors import ExecutionError
from checkmate.execute.random_replay import replaying, saved_state
from checkmate.simulate import Compute, Free

GradientSink = Callable[[int, torch.Tensor], None]
StepFunction = Callable[
    [Sequence[Any], GradientSink],
    tuple[torch.Tensor, tuple[torch.Tensor | None, ...], tuple[torch.Tensor, ...]],
]
Conform = Callable[[Any, tuple[int, ...], str], Any]
ScheduleItem = object
"""A step of a schedule as the executor runs it: a `Compute` or `Free`, a `SegmentCall`, a `Call`, or a kind added
with `emit_step.register`."""


@dataclass(frozen=True)
class Reference:
    """An argument slot filled at run time with the fx value `name`."""

    name: str


@dataclass(frozen=True, slots=True)
class Operation:
    """One member fx node, ready to evaluate.

    Attributes:
        name: the fx node's name (its value's name in the generated code).
        target: the fx node's target (an ATen overload or operator.getitem), for messages.
        function: what is called: the overload's underlying builtin (one Python frame less per op), else the target.
        args: positional arguments, with fx values replaced by Reference.
        kwargs: keyword arguments, likewise.
        release: names of member values that die right after this operation (last use within the node).
        stride: the strides the value had when traced, for values that a kernel may lay out otherwise at run time
            (None for views and non-tensors): see `step_function`'s `conform`.
    """

    name: str
    target: Callable[..., Any]
    function: Callable[..., Any]
    args: tuple[Any, ...]
    kwargs: dict[str, Any]
    release: tuple[str, ...]
    stride: tuple[int, ...] | None = None


@dataclass(frozen=True, slots=True)
class NodeProgram:
    """What computing one graph node means: its operations, what it keeps, and what leaves the step from it.

    Attributes:
        label: the node for messages, such as "graph node 3 ('convolution')".
        operations: its member fx nodes in order.
        exports: the members that outlive the node (one live copy of them per computation).
        loss: the loss's fx name when this node makes it, else None.
        gradients: (gradient index, fx name) of the gradients this node makes.
        buffer_updates: (buffer index, fx name) of the new buffer values this node makes.
        outputs: (output index, fx name) of the step's other outputs this node makes.
        random: whether the node draws from the random generator (replayed when recomputed).
    """

    label: str
    operations: tuple[Operation, ...]
    exports: tuple[str, ...]
    loss: str | None = None
    gradients: tuple[tuple[int, str], ...] = ()
    buffer_updates: tuple[tuple[int, str], ...] = ()
    outputs: tuple[tuple[int, str], ...] = ()
    random: bool = False

    @property
    def leaving(self) -> frozenset[str]:
        """The fx names of the values that leave the step from this node (loss, gradients, buffer updates, outputs):
        the step keeps them beyond the node, in memory the plan counts apart from the node's."""
        names = {name for _, name in (*self.gradients, *self.buffer_updates, *self.outputs)}
        return frozenset(names | ({self.loss} if self.loss is not None else set()))


@dataclass(frozen=True)
class SegmentCall:
    """Consecutive Compute steps run as one call of one compiled function (`checkmate.inductor.segments`).

    The call takes the list of its arguments and empties it (the boxed convention), so an argument that only the list
    holds dies inside the call after its last use: the live copies of the `handed` nodes, which the schedule frees
    during the run of steps, are deleted from the locals before the call.

    Attributes:
        label: the run of steps, for messages.
        function: called as `function(arguments)`, returns the values named by `outputs`, in order.
        computes: the Compute steps it runs, each of a node with no live copy, each node once; recomputations of
            nodes that make the loss or a buffer update excluded.
        inputs: fx names of its arguments, in order.
        outputs: fx names of what it returns: every export of the computed nodes still live after it, and the
            values leaving the step that first computations among them make.
        freed: computed nodes whose copy the schedule frees within the run (their values never leave the call).
        handed: other nodes whose only live copy the schedule frees within the run.
        seconds: the call's measured time (`checkmate.execute.predicted_time`).
    """

    label: str
    function: Callable[[list[Any]], Sequence[Any]]
    computes: tuple[Compute, ...]
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    freed: frozenset[int]
    handed: frozenset[int]
    seconds: float


@dataclass(frozen=True)
class Call:
    """A call, with no arguments, made at its place among the schedule's steps: what a step adds around the plan's
    operations there (`checkmate.sharded` gathers and frees a unit's parameters and reduces its gradients).

    Attributes:
        label: what it does, for the generated source and for messages.
        function: called as `function()`; what it returns is dropped.
    """

    label: str
    function: Callable[[], object]


@dataclass(frozen=True)
class StepSource:
    """What a step function is generated from: the program's nodes and inputs, and the schedule's steps.

    Attributes:
        nodes: one program per graph node.
        placeholders: the fx names of the inputs, in the order the function receives them.
        constants: fx values fixed at capture (get_attr), by name.
        buffer_count: how many buffers the step may update (the length of the returned updates).
        steps: the schedule's Compute and Free steps, runs of them possibly replaced by SegmentCalls, and Calls
            placed among them.
        conform: restores a value's traced layout (None: values are used as the kernels lay them out).
        output_count: how many other outputs the step returns beside the loss (the length of the returned outputs).
    """

    nodes: tuple[NodeProgram, ...]
    placeholders: tuple[str, ...]
    constants: dict[str, Any]
    buffer_count: int
    steps: tuple[ScheduleItem, ...]
    conform: Conform | None = None
    output_count: int = 0


@dataclass(frozen=True, slots=True)
class _Failure:
    """Where a source line of the generated function runs: which operation, of which node, in which stage."""

    label: str
    stage: int
    operation: Operation

    def error(self, cause: Exception) -> ExecutionError:
        operation = self.operation
        return ExecutionError(
            f"{self.label}, stage {self.stage}: fx node {operation.name!r} ({operation.target}) failed: {cause}"
        )


def step_function(source: StepSource) -> StepFunction:
    """Compile the schedule into `step(inputs, on_gradient) -> (loss, buffer_updates, outputs)`.

    `inputs` are the live values of the placeholders, in order; `buffer_updates` has one entry per buffer, None
    where the step leaves it unchanged; `outputs` are the step's other outputs, detached. The caller runs it under
    `torch.no_grad()`.

    Raises:
        ExecutionError: the schedule frees a node that holds no live copy, or never computes the loss.
    """
    writer = StepWriter(source)
    for step in source.steps:
        emit_step(step, writer)
    return writer.finish()


@functools.singledispatch
def emit_step(step: object, writer: StepWriter) -> None:
    """Write the source lines of one schedule step. The kinds of step are open: a module that adds one (a copy to
    another memory, say) registers its lowering with `@emit_step.register` beside its class, and writes through the
    writer's `emit`, `bind` and `variable`.

    Raises:
        ExecutionError: no lowering is registered for the step's class.
    """
    raise ExecutionError(
        f"no lowering for a schedule step of kind {type(step).__name__}: register one with "
        "checkmate.execute.codegen.emit_step.register"
    )


@emit_step.register(Compute)
def _(step: Compute, writer: StepWriter) -> None:
    writer.compute(step.node, step.stage)


@emit_step.register(Free)
def _(step: Free, writer: StepWriter) -> None:
    writer.free(step.node, step.stage)


@emit_step.register(SegmentCall)
def _(step: SegmentCall, writer: StepWriter) -> None:
    writer.segment(step)


@emit_step.register(Call)
def _(step: Call, writer: StepWriter) -> None:
    writer.call(step)


def _cuda_devices(inputs: Sequence[Any]) -> list[int]:
    return sorted({value.device.index or 0 for value in inputs if isinstance(value, torch.Tensor) and value.is_cuda})


BODY = "        "


class StepWriter:
    """Writes the source of one step function, step by step, tracking the live copies of each node.

    A step's lowering (`emit_step`) adds lines with `emit` (indented by `BODY`), reaches Python objects through `bind`
    and values through `variable`."""

    def __init__(self, source: StepSource) -> None:
        self.source = source
        self.names = _Names()
        self.variables = _Variables()
        for name, value in source.constants.items():
            self.names.bound[self.variables.of(name)] = value
        self.conform = self.names.bind(source.conform, "conform") if source.conform is not None else None
        self.lines: list[str] = []
        self.failures: dict[int, _Failure] = {}
        self.held: dict[int, collections.deque[str]] = collections.defaultdict(collections.deque)
        self.copies: dict[int, int] = collections.defaultdict(int)
        self.operation_lines: dict[int, list[tuple[Operation, list[str]]]] = {}
        self.holds = 0
        self.segments = 0
        self.loss_taken = False
        self.replayed = {step.node for step in source.steps if isinstance(step, Compute) and step.stage != step.node}

    def compute(self, index: int, stage: int) -> None:
        node = self.source.nodes[index]
        first = stage == index
        self.emit(f"{BODY}# Compute({index}, {stage}): {node.label}")
        if self.copies[index] and node.exports:
            self._hold(index, node)
        indent = BODY
        if node.random and first and index in self.replayed:
            self.emit(f"{BODY}rng_{index} = save_random_state(cuda_devices)")
        elif node.random and not first:
            self.emit(f"{BODY}with replayed(rng_{index}, cuda_devices):")
            indent += "    "
        for operation, lines in self._operation_lines(index):
            failure = _Failure(node.label, stage, operation)
            for line in lines:
                self.emit(indent + line, failure)
            if first:
                self._take(node, operation.name, indent, failure)
            if operation.release:
                self.emit(indent + "del " + ", ".join(map(self.variables.of, operation.release)))
        if node.random and not first and not node.operations:
            self.emit(indent + "pass")
        if not first:
            self._share_step_outputs(node)
        if first and node.loss is not None:
            self.loss_taken = True
        self.copies[index] += 1

    def free(self, index: int, stage: int) -> None:
        node = self.source.nodes[index]
        if not self.copies[index]:
            raise ExecutionError(f"the schedule frees {node.label} in stage {stage}, which holds no live copy")
        self.copies[index] -= 1
        self.emit(f"{BODY}# Free({index}, {stage})")
        if self.held[index]:
            self.emit(f"{BODY}del {self.held[index].popleft()}")
        elif node.exports:
            self.emit(BODY + "del " + ", ".join(map(self.variables.of, node.exports)))

    def arrive(self, index: int, expression: str) -> None:
        """Emit `expression`, which returns node `index`'s exported values in order, as a new live copy of the node
        (a value copied back from elsewhere, say): read and freed as a computed copy is."""
        node = self.source.nodes[index]
        if self.copies[index] and node.exports:
            self._hold(index, node)
        targets = "".join(f"{self.variables.of(name)}, " for name in node.exports)
        self.emit(f"{BODY}{targets or '_'} = {expression}")
        self.copies[index] += 1

    def segment(self, call: SegmentCall) -> None:
        number = self.segments
        self.segments += 1
        arguments, returned = f"arguments_{number}", f"returned_{number}"
        function = self.names.bind(call.function, "f")
        operation = Operation(returned, call.function, call.function, (), {}, ())
        failure = _Failure(call.label, call.computes[0].stage, operation)
        self.emit(f"{BODY}# {call.label}")
        for index in call.handed:
            if self.copies[index] != 1 or self.held[index]:
                label = self.source.nodes[index].label
                raise ExecutionError(f"{call.label} frees {label}, which does not hold exactly one live copy")
            self.copies[index] -= 1
        self.emit(f"{BODY}{arguments} = [" + ", ".join(map(self.variables.of, call.inputs)) + "]")
        dying = [name for index in sorted(call.handed) for name in self.source.nodes[index].exports]
        if dying:
            self.emit(BODY + "del " + ", ".join(map(self.variables.of, dying)))
        self.emit(f"{BODY}{returned} = {function}({arguments})", failure)
        self.emit(BODY + "".join(f"{self.variables.of(name)}, " for name in call.outputs) + f"= {returned}")
        self.emit(f"{BODY}del {arguments}, {returned}")
        live: set[str] = set()
        for step in call.computes:
            node = self.source.nodes[step.node]
            if step.stage == step.node:
                for name in call.outputs:
                    self._take(node, name, BODY, failure)
                self.loss_taken |= node.loss is not None
            if step.node not in call.freed:
                self.copies[step.node] += 1
                live.update(node.exports)
        transient = [name for name in call.outputs if name not in live]
        if transient:
            self.emit(BODY + "del " + ", ".join(map(self.variables.of, transient)))

    def call(self, call: Call) -> None:
        """Emit the call; what it raises propagates as raised."""
        self.emit(f"{BODY}# {' '.join(call.label.split())}")
        self.emit(f"{BODY}{self.names.bind(call.function, 'f')}()")

    def finish(self) -> StepFunction:
        if not self.loss_taken:
            raise ExecutionError("the schedule never computed the loss node")
        source = self.source
        updates = [f"update_{buffer}" for buffer in range(source.buffer_count)]
        outputs = [f"output_{output}" for output in range(source.output_count)]
        head = ["def step(inputs, on_gradient):"]
        if source.placeholders:
            head.append("    " + "".join(f"{self.variables.of(name)}, " for name in source.placeholders) + "= inputs")
        if self.replayed & {index for index, node in enumerate(source.nodes) if node.random}:
            head.append("    cuda_devices = cuda_devices_of(inputs)")
        head += ["    loss = None", *(f"    {value} = None" for value in updates + outputs), "    try:"]
        tail = [
            "    except Exception as error:",
            "        failure = failures.get(error.__traceback__.tb_lineno)",
            "        if failure is None:",
            "            raise",
            "        raise failure.error(error) from error",
            "    return loss, ("
            + "".join(f"{update}, " for update in updates)
            + "), ("
            + "".join(f"{output}, " for output in outputs)
            + ")",
        ]
        offset = len(head)
        namespace = {
            **self.names.bound,
            "failures": {line + offset: failure for line, failure in self.failures.items()},
            "save_random_state": saved_state,
            "replayed": replaying,
            "cuda_devices_of": _cuda_devices,
        }
        text = "\n".join(head + self.lines + tail)
        exec(compile(text, f"<checkmate step of {len(source.steps)} steps>", "exec"), namespace)
        function: StepFunction = namespace["step"]
        return function

    def emit(self, line: str, failure: _Failure | None = None) -> None:
        """Add a line of the try block; a failure on it is reported as `failure`'s operation failing."""
        self.lines.append(line)
        if failure is not None:
            self.failures[len(self.lines)] = failure

    def bind(self, value: Any, prefix: str) -> str:
        """The global name the generated function reads `value` by (a function or a constant), as `prefix` and a
        number."""
        return self.names.bind(value, prefix)

    def variable(self, name: str) -> str:
        """The local variable that holds the fx value `name`."""
        return self.variables.of(name)

    def _hold(self, index: int, node: NodeProgram) -> None:
        """Keep the live copy's values alive (the schedule holds them) while the locals take the new copy."""
        held = f"held_{index}_{self.holds}"
        self.holds += 1
        self.emit(f"{BODY}{held} = (" + "".join(f"{self.variables.of(name)}, " for name in node.exports) + ")")
        self.held[index].append(held)

    def _take(self, node: NodeProgram, name: str, indent: str, failure: _Failure) -> None:
        """Hand over the values that leave the step, right after they are made (first computation only)."""
        value = self.variables.of(name)
        lines = []
        if name == node.loss:
            lines.append(f"loss = {value}.detach()")
        lines += [f"on_gradient({parameter}, {value})" for parameter, gradient in node.gradients if gradient == name]
        lines += [f"update_{buffer} = {value}" for buffer, update in node.buffer_updates if update == name]
        lines += [f"output_{output} = {value}.detach()" for output, made in node.outputs if made == name]
        for line in lines:
            self.emit(indent + line, failure)

    def _share_step_outputs(self, node: NodeProgram) -> None:
        """A recomputation makes the step's outputs again, with the same values. Exported ones (BatchNorm's new
        running statistics, which its backward reads) are swapped for the first run's tensors: the plan counts
        those once, in the fixed memory, and the new ones die with the node, as its recompute workspace says."""
        for buffer, update in node.buffer_updates:
            if update in node.exports:
                self.emit(f"{BODY}{self.variables.of(update)} = update_{buffer}")
        for output, made in node.outputs:
            if made in node.exports:
                self.emit(f"{BODY}{self.variables.of(made)} = output_{output}")
        if node.loss is not None and node.loss in node.exports:
            self.emit(f"{BODY}{self.variables.of(node.loss)} = loss")

    def _operation_lines(self, index: int) -> list[tuple[Operation, list[str]]]:
        """Each operation of node `index` as source lines (its call and layout check), rendered once per node."""
        rendered = self.operation_lines.get(index)
        if rendered is None:
            rendered = [(operation, self._render(operation)) for operation in self.source.nodes[index].operations]
            self.operation_lines[index] = rendered
        return rendered

    def _render(self, operation: Operation) -> list[str]:
        names, variables = self.names, self.variables
        function = names.bind(operation.function, "f")
        arguments = [names.render(value, variables) for value in operation.args]
        arguments += [f"{key}={names.render(value, variables)}" for key, value in operation.kwargs.items()]
        value = variables.of(operation.name)
        lines = [f"{value} = {function}({', '.join(arguments)})"]
        if self.conform is not None and operation.stride is not None:
            stride = names.bind(operation.stride, "s")
            lines.append(
                f"if {value}.stride() != {stride}: {value} = {self.conform}({value}, {stride}, {operation.name!r})"
            )
        return lines


class _Variables:
    """The local variable of each fx value: `v_` and its name (fx names are identifiers), else a numbered one."""

    def __init__(self) -> None:
        self.names: dict[str, str] = {}

    def of(self, name: str) -> str:
        variable = self.names.get(name)
        if variable is None:
            variable = f"v_{name}" if name.isidentifier() else f"v{len(self.names)}"
            self.names[name] = variable
        return variable


class _Names:
    """The globals of one generated function: targets (f0, f1, ...), constants (c0, ...) and strides (s0, ...)."""

    def __init__(self) -> None:
        self.bound: dict[str, Any] = {}
        self.counts: dict[str, int] = {}

    def bind(self, value: Any, prefix: str) -> str:
        number = self.counts.get(prefix, 0)
        self.counts[prefix] = number + 1
        self.bound[f"{prefix}{number}"] = value
        return f"{prefix}{number}"

    def render(self, value: Any, variables: _Variables) -> str:
        """Source text for one argument: locals for references, containers spelled out, anything else bound."""
        if isinstance(value, Reference):
            return variables.of(value.name)
        if isinstance(value, tuple):
            return "(" + "".join(f"{self.render(item, variables)}, " for item in value) + ")"
        if isinstance(value, list):
            return "[" + ", ".join(self.render(item, variables) for item in value) + "]"
        if isinstance(value, dict) and all(isinstance(key, str) for key in value):
            return "{" + ", ".join(f"{key!r}: {self.render(item, variables)}" for key, item in value.items()) + "}"
        return self.bind(value, "c")
