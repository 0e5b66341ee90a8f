"""A schedule cut into the forward and backward graphs that AOTAutograd runs, for `checkmate.inductor.backend`.

AOTAutograd's partition contract: the forward graph takes the primals and returns the forward outputs and then the
values saved for the backward; the backward graph takes those saved values and then the tangents, and returns a
gradient (or None) per primal. Here both graphs are the schedule's own steps, in order, each `Compute` one call of
the node's compiled function (`checkmate.inductor.kernels`) and one `getitem` per value it returns:

* the forward graph holds the steps of the stages before the first backward node, the backward graph the rest;
* the values saved are those the backward graph reads before it computes them itself: what the plan keeps across
  the boundary (a value the plan frees and recomputes in the backward is recomputed there, not saved);
* a recomputation is a separate call, and fx frees every value after its last reader, which is never later than the
  plan's `Free` (a reader after the `Free` reads a later computation), so the graphs hold at most what the plan does;
* forward outputs and gradients are the values of their node's first computation, as the eager executor takes them;
* constants of the joint graph (its `get_attr` values, such as the `_tensor_constant0` a `torch.tensor(2.0)` in the
  forward makes) are attributes of both graphs, each fetching them where it reads them: never saved, never freed;
* a random node that is computed more than once saves the generator state before its first computation and replays
  it for every recomputation (the state is a value like the others, saved for the backward when it needs it);
* steps of other kinds (a `GraphStep`: the copies to host memory of `checkmate.inductor.moved_region`) say which
  values they read and make, and write their own calls: a value one makes in the forward and the backward reads is
  saved, as a computed one is.
"""

from __future__ import annotations

import functools
import operator
from collections.abc import Callable, Sequence
from typing import Any, Protocol

import torch
import torch.fx

from checkmate.captured import Captured
from checkmate.errors import CheckmateError
from checkmate.execute.random_replay import replaying, saved_state
from checkmate.inductor.kernels import NodeKernel
from checkmate.simulate import Compute

RANDOM_STATE = "random_state_{}"


class GraphStep(Protocol):
    """A step of a region's graphs other than a computation: it belongs to the graph of its `stage`, reads the
    values `reads` and makes those `makes` (fx names), and writes its calls with `emit`."""

    @property
    def stage(self) -> int: ...

    @property
    def reads(self) -> tuple[str, ...]: ...

    @property
    def makes(self) -> tuple[str, ...]: ...

    def emit(self, builder: GraphBuilder) -> None: ...


def split_schedule(
    captured: Captured,
    kernels: Sequence[NodeKernel],
    steps: Sequence[Compute | GraphStep],
    *,
    fake_mode: Any,
    mutated_inputs: frozenset[str] = frozenset(),
) -> tuple[torch.fx.GraphModule, torch.fx.GraphModule]:
    """The forward and backward graphs that run `steps`: a schedule's computations, in order, with steps of other
    kinds among them (see the module docstring).

    `mutated_inputs` are primals the region changes in place (AOTAutograd writes their new values back after the
    forward, BatchNorm's running statistics): one the backward reads is copied at the start of the forward and the
    copy saved, so a recomputation reads the value the first computation read (the caller counts the copies in the
    fixed memory)."""
    joint = captured.module
    placeholders = [node for node in joint.graph.nodes if node.op == "placeholder"]
    tangents = [node for node in placeholders if node.name.startswith("tangents")]
    primals = [node for node in placeholders if not node.name.startswith("tangents")]
    meta = {node.name: node.meta.get("val") for node in joint.graph.nodes}
    boundary = next((index for index, node in enumerate(captured.graph.nodes) if node.backward), captured.graph.size)
    computes = [step for step in steps if isinstance(step, Compute)]
    forward_steps = [step for step in steps if step.stage < boundary]
    backward_steps = [step for step in steps if step.stage >= boundary]
    replayed = {index for index in captured.random_nodes if sum(step.node == index for step in computes) > 1}
    if replayed and not captured.device.startswith("cpu"):
        raise CheckmateError(
            f"the plan recomputes {len(replayed)} random nodes on {captured.device}, and this backend replays only the "
            "CPU generator: raise the budget, or use checkmate.compile(..., executor='inductor'), which replays CUDA "
            "generators too"
        )
    with fake_mode:
        state_meta = torch.empty(torch.get_rng_state().numel(), dtype=torch.uint8)
    meta |= {RANDOM_STATE.format(index): state_meta for index in replayed}

    constants = {node.name: str(node.target) for node in joint.graph.nodes if node.op == "get_attr"}
    saved = _read_before_made(kernels, backward_steps, replayed, {node.name for node in tangents} | constants.keys())
    forward = GraphBuilder(joint, constants, kernels, replayed, meta, fake_mode)
    for node in primals:
        forward.input(node.name)
    copies = {name: forward.copy(name) for name in saved if name in mutated_inputs}
    for step in forward_steps:
        forward.step(step)
    forward_outputs = [forward.made(name) for name in captured.region_outputs]
    forward_module = forward.finish([*forward_outputs, *(copies.get(name) or forward.current[name] for name in saved)])

    backward = GraphBuilder(joint, constants, kernels, replayed, meta, fake_mode)
    for name in [*saved, *(node.name for node in tangents)]:
        backward.input(name)
    for step in backward_steps:
        backward.step(step)
    gradients = [None if name is None else backward.made(name) for name in captured.gradients]
    return forward_module, backward.finish(gradients)


def _read_before_made(
    kernels: Sequence[NodeKernel], steps: Sequence[Compute | GraphStep], replayed: set[int], available: set[str]
) -> list[str]:
    """Names the backward steps read before making them (those `available` to the backward excepted: tangents,
    constants), in first-read order."""
    made: set[str] = set()
    read: dict[str, None] = {}
    for step in steps:
        if isinstance(step, Compute):
            kernel = kernels[step.node]
            state = RANDOM_STATE.format(step.node)
            needed = [*kernel.inputs, *([state] if step.node in replayed and state not in made else [])]
            making = kernel.outputs
        else:
            needed, making = list(step.reads), step.makes
        for name in needed:
            if name not in made and name not in available:
                read.setdefault(name)
        made.update(making)
    return list(read)


class GraphBuilder:
    """Writes one fx graph: placeholders, then each computation as a call and its getitems, and the calls of other
    steps; the joint graph's constants (`constants`: fx name to attribute of `joint`) are fetched where first read.
    `meta` (fx name to the value's fake tensor) is shared by a region's two graphs: a value a step makes in the
    forward has its metadata there when the backward takes it as an input."""

    def __init__(
        self,
        joint: torch.fx.GraphModule,
        constants: dict[str, str],
        kernels: Sequence[NodeKernel],
        replayed: set[int],
        meta: dict[str, Any],
        fake_mode: Any,
    ) -> None:
        self.joint = joint
        self.constants = constants
        self.graph = torch.fx.Graph()
        self.kernels = kernels
        self.replayed = replayed
        self.meta = meta
        self.fake_mode = fake_mode
        self.current: dict[str, torch.fx.Node] = {}
        self.first: dict[str, torch.fx.Node] = {}
        self.effects: set[torch.fx.Node] = set()

    def input(self, name: str) -> None:
        node = self.graph.placeholder(name)
        node.meta["val"] = self.meta[name]
        self.current[name] = node
        self.first.setdefault(name, node)

    def read(self, name: str) -> torch.fx.Node:
        """The value `name` as it is now: the latest computation's, an input's, or the constant's."""
        if name not in self.current and name in self.constants:
            constant = self.graph.get_attr(self.constants[name])
            constant.meta["val"] = self.meta[name]
            self.current[name] = self.first[name] = constant
        return self.current[name]

    def made(self, name: str) -> torch.fx.Node:
        """The value `name` as its first computation made it (an input's or a constant's own value)."""
        return self.first[name] if name in self.first else self.read(name)

    def copy(self, name: str) -> torch.fx.Node:
        """A copy of input `name` as it is now."""
        copied = self.graph.call_function(torch.ops.aten.clone.default, (self.current[name],))
        copied.meta["val"] = self.meta[name]
        return copied

    def step(self, step: Compute | GraphStep) -> None:
        if isinstance(step, Compute):
            self.compute(step.node)
        else:
            step.emit(self)

    def call(self, function: Callable[..., Any], arguments: Sequence[Any], name: str | None) -> torch.fx.Node:
        """A call of `function` (a plain function, which fx names in its code) on `arguments` (nodes and
        constants) for a step of another kind; its value is `name`'s, whose metadata is in `meta`, or nothing
        (None). Such a call has effects: it stays in the graph though nothing reads its value."""
        call = self.graph.call_function(function, tuple(arguments))
        if name is not None:
            call.meta["val"] = self.meta[name]
            self.current[name] = call
            self.first.setdefault(name, call)
        self.effects.add(call)
        return call

    def unpack(self, call: torch.fx.Node, names: Sequence[str]) -> None:
        """The values `names` as the items of `call`'s tuple, in order."""
        for position, name in enumerate(names):
            value = self.graph.call_function(operator.getitem, (call, position))
            value.meta["val"] = self.meta[name]
            self.current[name] = value
            self.first.setdefault(name, value)

    def compute(self, index: int) -> None:
        kernel = self.kernels[index]
        arguments: tuple[Any, ...] = tuple(self.read(name) for name in kernel.inputs)
        function = named(kernel.function, f"node_{index}")
        state = RANDOM_STATE.format(index)
        if index in self.replayed and state in self.current:
            arguments = (self.current[state], *arguments)
            function = named(functools.partial(_replayed, kernel.function), f"replay_node_{index}")
        elif index in self.replayed:
            saved = self.graph.call_function(_random_state, ())
            saved.meta["val"] = self.meta[state]
            self.current[state] = saved
        call = self.graph.call_function(function, arguments)
        self.unpack(call, kernel.outputs)

    def finish(self, outputs: Sequence[torch.fx.Node | None]) -> torch.fx.GraphModule:
        self.graph.output(tuple(outputs))
        self.graph.eliminate_dead_code(is_impure_node=lambda node: node in self.effects or node.is_impure())
        return torch.fx.GraphModule(self.joint, self.graph)


def named(function: Callable[..., Any], name: str) -> Callable[..., Any]:
    """`function` as a plain function called `name`: fx refers to call targets by name in the code it generates."""

    def call(*arguments: Any) -> Any:
        return function(*arguments)

    call.__name__ = call.__qualname__ = name
    return call


def _random_state() -> torch.Tensor:
    """The CPU generator's state, a value of the graph (this backend replays the CPU generator only)."""
    cpu_state, _ = saved_state(())
    return cpu_state


def _replayed(function: Callable[..., Any], state: torch.Tensor, *arguments: Any) -> Any:
    """Run the node's function with the CPU generator as `_random_state` found it before the node's first
    computation (`checkmate.execute.random_replay`)."""
    with replaying((state, []), ()):
        return function(*arguments)
