"""Compile each planning node of a captured step into one Inductor function.

A planning node's member fx ops are copied into a small ATen graph of their own: its placeholders are the values the
node reads (parameters, buffers, batch tensors, constants, other nodes' exports) and its outputs the values it
exports or hands out of the step (loss, gradients, buffer updates). Inductor compiles that graph (`compile_fx`:
its decompositions, fusion into generated C++ or Triton loops, library calls for convolutions and matrix products).

One compiled function per node is what keeps the plan's semantics:

* A recomputation is a second call of the node's function: no common-subexpression elimination can merge it with
  the first computation, since they are in different graphs.
* No reordering crosses a node boundary: a value lives exactly from the call that makes it to the schedule's `del`,
  and inside the call Inductor frees or never materializes the node's inner values.
* Inductor's buffers inside a call are measured on the allocator (`checkmate.inductor.measure`) and planned as the
  node's workspace, neither counted twice nor missed.

Some nodes run as their ATen ops instead:

* nodes that draw random numbers: their dropout masks are eager's bit for bit, and the executor replays them when it
  recomputes the node;
* nodes that are one convolution (forward or backward, with views of its inputs and outputs,
  `checkmate.torch_capture.fusion.convolution_call`): nothing in them fuses, and Inductor compiles them to the same
  library call, in a layout it picks (with copies around it where the trace's layout differs). Measured on the
  full-size CNNs of `benchmarks/peers.py`, that runs no faster in all, and much slower for a depthwise convolution's
  backward (`benchmarks/investigations/convolution_nodes.py`). They stay out of the fused runs of a schedule too
  (`checkmate.inductor.segments`), like every node run as ATen ops: runs that then hold only what Inductor fuses
  compile in a fraction of the time (BENCHMARKS.md, "Time as Inductor runs it");
* nodes Inductor fails to compile (logged).

The graphs are built with canonical names (`input_0`, `op_0`, ...), so nodes that do the same thing on the same
shapes (the layers of a transformer) have the same key and share one compiled function. Each is compiled as Dynamo
hands a graph to a backend: on fake inputs of the traced shapes and strides (static), under a tracing context whose
fake mode has a shape environment. That is what Inductor's FX graph cache needs to look a graph up (without it every
graph bypasses the cache), so a process that compiles a model again (the next run of a script) loads each graph's
code from the cache instead of generating it.
"""

from __future__ import annotations

import copy
import dataclasses
import hashlib
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.fx
from torch._guards import TracingContext, tracing
from torch._inductor.compile_fx import compile_fx
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.fx.experimental.symbolic_shapes import ShapeEnv

from checkmate.captured import Captured
from checkmate.inductor.kernel_builds import batched_builds
from checkmate.stage_times import Stage, timed
from checkmate.torch_capture.fusion import convolution_call

log = logging.getLogger(__name__)

PROGRESS_INTERVAL = 10.0

# Functions compiled in this process (None: Inductor could not), by key and thread count. The key names the graph's
# code and its inputs' layouts, so an entry never serves another graph.
_COMPILED: dict[tuple[str, int], Callable[..., Any] | None] = {}


@dataclass(frozen=True)
class NodeKernel:
    """One planning node as one function: `function(*inputs)` returns the values named by `outputs`, in order.

    Attributes:
        index: the planning node.
        inputs: fx names of the values the node reads, in argument order.
        outputs: fx names of the values it returns: its exports and what leaves the step.
        key: identifies the node's graph and input layouts; nodes with one key share one function.
        module: the node's ATen graph (canonical names), run as it is when `compiled` is False.
        function: the Inductor-compiled graph, or `module` itself.
        compiled: whether Inductor compiled it (only such nodes join the fused runs of a schedule,
            `checkmate.inductor.segments`).
    """

    index: int
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    key: str
    module: torch.fx.GraphModule
    function: Callable[..., Any]
    compiled: bool


def as_aten_ops(kernel: NodeKernel) -> NodeKernel:
    """The node as its ATen ops (its `module`), measured and cached under a key of their own."""
    return dataclasses.replace(kernel, key=f"{kernel.key}:aten", function=kernel.module, compiled=False)


def node_graphs(captured: Captured) -> list[tuple[torch.fx.GraphModule, tuple[str, ...], tuple[str, ...], str]]:
    """For each planning node: its ATen graph with canonical names, its inputs, its outputs and its key."""
    fx_nodes = {node.name: node for node in captured.module.graph.nodes}
    leaving = leaving_values(captured)
    return [
        subgraph(fx_nodes, members, frozenset(exports) | leaving)
        for members, exports in zip(captured.members, captured.exports, strict=True)
    ]


def leaving_values(captured: Captured) -> frozenset[str]:
    """The fx values that leave the step: the loss, the gradients, the buffer updates and a region's outputs."""
    return frozenset(
        {
            captured.loss,
            *filter(None, captured.gradients),
            *filter(None, captured.input_gradients),
            *filter(None, captured.buffer_updates),
            *captured.region_outputs,
        }
    )


def subgraph(
    fx_nodes: dict[str, torch.fx.Node], members: Sequence[str], returned: frozenset[str]
) -> tuple[torch.fx.GraphModule, tuple[str, ...], tuple[str, ...], str]:
    """The ATen graph of the fx ops `members` (in order), with canonical names: its inputs are the values they read
    from outside, its outputs the members named in `returned`. Returns (graph, inputs, outputs, key)."""
    graph = torch.fx.Graph()
    environment: dict[str, torch.fx.Node] = {}
    inputs: list[str] = []
    member_set = set(members)

    def argument(node: torch.fx.Node) -> torch.fx.Node:
        if node.name not in environment:
            placeholder = graph.placeholder(f"input_{len(inputs)}")
            placeholder.meta = dict(node.meta)
            environment[node.name] = placeholder
            inputs.append(node.name)
        return environment[node.name]

    computed = [name for name in members if fx_nodes[name].op == "call_function"]
    for position, name in enumerate(computed):
        fx_node = fx_nodes[name]
        for source in fx_node.all_input_nodes:
            if source.name not in member_set:
                argument(source)
        args = torch.fx.node.map_arg(fx_node.args, lambda node: environment[node.name])
        kwargs = torch.fx.node.map_arg(fx_node.kwargs, lambda node: environment[node.name])
        copied = graph.create_node("call_function", fx_node.target, args, kwargs, name=f"op_{position}")
        copied.meta = dict(fx_node.meta)
        environment[name] = copied
    outputs = tuple(name for name in computed if name in returned)
    graph.output(tuple(environment[name] for name in outputs))
    module = torch.fx.GraphModule(torch.nn.Module(), graph)
    layouts = [_describe(fx_nodes[name].meta.get("val")) for name in inputs]
    key = hashlib.sha1(f"{module.code}|{layouts}".encode()).hexdigest()
    return module, tuple(inputs), outputs, key


def _describe(value: Any) -> str:
    if isinstance(value, torch.Tensor):
        return f"{tuple(value.shape)}:{tuple(value.stride())}:{value.dtype}:{value.device}"
    return repr(value)


def compile_kernels(captured: Captured) -> tuple[NodeKernel, ...]:
    """Compile every planning node of `captured` (random nodes, convolutions and failures stay ATen ops), one compile
    per key."""
    with timed(Stage.NODE_COMPILE):
        return _compile_kernels(captured)


def _compile_kernels(captured: Captured) -> tuple[NodeKernel, ...]:
    fx_nodes = {node.name: node for node in captured.module.graph.nodes}
    started = time.perf_counter()
    graphs = node_graphs(captured)
    convolutions = {index for index, members in enumerate(captured.members) if convolution_call(members, fx_nodes)}
    wanted: dict[str, GraphToCompile] = {}
    for index, (module, inputs, outputs, key) in enumerate(graphs):
        if key not in wanted and index not in captured.random_nodes and index not in convolutions:
            wanted[key] = GraphToCompile(key, module, inputs, outputs, f"planning node {index}")
    functions = dict(zip(wanted, compile_graphs(list(wanted.values()), fx_nodes), strict=True))
    kernels = []
    for index, (module, inputs, outputs, key) in enumerate(graphs):
        made = functions.get(key)
        if index in convolutions:
            kernels.append(as_aten_ops(NodeKernel(index, inputs, outputs, key, module, module, compiled=False)))
        elif made is None or index in captured.random_nodes:
            kernels.append(NodeKernel(index, inputs, outputs, key, module, module, compiled=False))
        else:
            kernels.append(NodeKernel(index, inputs, outputs, key, module, made, compiled=True))
    failed = len(kernels) - len(convolutions) - len(captured.random_nodes) - sum(kernel.compiled for kernel in kernels)
    log.info(
        "Inductor: %d nodes as %d distinct functions in %.1f s (%d convolutions, %d random nodes and %d others run "
        "as ATen ops)",
        len(kernels),
        len(wanted),
        time.perf_counter() - started,
        len(convolutions),
        len(captured.random_nodes),
        failed,
    )
    return tuple(kernels)


@dataclass(frozen=True)
class GraphToCompile:
    """A `subgraph` to compile: its graph, the fx names of its inputs and outputs, its key, and what it is (for the
    log)."""

    key: str
    module: torch.fx.GraphModule
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    what: str


def compile_graphs(
    graphs: Sequence[GraphToCompile], fx_nodes: dict[str, torch.fx.Node]
) -> list[Callable[..., Any] | None]:
    """Inductor's function for each graph, or None (logged) where Inductor cannot compile it or its function returns
    a value laid out otherwise than traced (a view of a buffer whose layout Inductor chose, such as a `cat`'s): the
    nodes that read it are compiled for the traced strides, so such a graph runs as ATen ops. Their C++ kernels are
    built together (`checkmate.inductor.kernel_builds`), and each graph is compiled once per key and thread count in
    this process (Inductor's C++ kernels are built for the thread count): a second capture of the same model (another
    budget, a replan) compiles nothing it compiled before."""
    threads = torch.get_num_threads()
    fresh = {graph.key: graph for graph in graphs if (graph.key, threads) not in _COMPILED}
    started, last_report = time.perf_counter(), time.perf_counter()
    made: dict[str, Callable[..., Any] | None] = {}
    with batched_builds():
        for number, graph in enumerate(fresh.values()):
            made[graph.key] = _inductor_function(graph, fx_nodes)
            if time.perf_counter() - last_report > PROGRESS_INTERVAL:
                last_report = time.perf_counter()
                log.info("Inductor: %d of %d graphs compiled in %.0f s", number + 1, len(fresh), last_report - started)
    for key, function in made.items():
        _COMPILED[key, threads] = None if function is None else _checked(function, fresh[key], fx_nodes)
    return [_COMPILED[graph.key, threads] for graph in graphs]


def _inductor_function(graph: GraphToCompile, fx_nodes: dict[str, torch.fx.Node]) -> Callable[..., Any] | None:
    """Inductor's function for `graph` (its kernels built as `batched_builds` does, its code through Inductor's FX
    graph cache: module doc), or None (logged)."""
    fake_mode = FakeTensorMode(shape_env=ShapeEnv())
    examples = [_fake(fake_mode, example_value(fx_nodes[name])) for name in graph.inputs]
    try:
        with torch.no_grad(), tracing(TracingContext(fake_mode)):
            return compile_fx(copy.deepcopy(graph.module), examples)  # type: ignore[return-value]
    except Exception as error:  # Inductor raises many types; the graph then runs as ATen ops, as before
        log.warning("Inductor could not compile %s; it runs as ATen ops: %s", graph.what, error)
        return None


def _fake(fake_mode: FakeTensorMode, value: Any) -> Any:
    """`value` as a fake tensor of its shape and strides, static (a value that is not a tensor as it is)."""
    return fake_mode.from_tensor(value, static_shapes=True) if isinstance(value, torch.Tensor) else value


def _checked(
    function: Callable[..., Any], graph: GraphToCompile, fx_nodes: dict[str, torch.fx.Node]
) -> Callable[..., Any] | None:
    """`function` where a trial call on zeros runs and returns every value laid out as traced, else None (logged)."""
    examples = [example_value(fx_nodes[name]) for name in graph.inputs]
    try:
        with torch.no_grad():
            returned = function(*examples)
    except Exception as error:  # as above
        log.warning("Inductor's function for %s failed on a trial call; it runs as ATen ops: %s", graph.what, error)
        return None
    return function if _laid_out_as_traced(returned, graph.outputs, fx_nodes, graph.what) else None


def _laid_out_as_traced(
    returned: Sequence[Any], outputs: Sequence[str], fx_nodes: dict[str, torch.fx.Node], what: str
) -> bool:
    for name, value in zip(outputs, returned, strict=True):
        traced = fx_nodes[name].meta.get("val")
        if isinstance(value, torch.Tensor) and isinstance(traced, torch.Tensor) and value.stride() != traced.stride():
            log.info(
                "%s runs as ATen ops: Inductor returns %r with strides %s where the trace has %s",
                what,
                name,
                tuple(value.stride()),
                tuple(traced.stride()),
            )
            return False
    return True


def example_value(node: torch.fx.Node) -> Any:
    """A tensor of the traced shape, strides and dtype, of zeros (the compiler reads no contents; the trial call after
    compiling does, and zeros are valid indices for gathers and embeddings)."""
    value = node.meta.get("val")
    if not isinstance(value, torch.Tensor):
        return value
    shape, stride = tuple(value.shape), tuple(value.stride())
    return torch.empty_strided(shape, stride, dtype=value.dtype, device=value.device).zero_()


def boxed_entry(function: Callable[..., Any]) -> Callable[[list[Any]], Any] | None:
    """The boxed form of a `compile_fx` function: called with the argument list, it empties the list, and Inductor's
    code then frees each argument after its last use (when nothing else holds it). It is AOTAutograd's runtime wrapper
    under `compile_fx`'s unboxed wrappers (which add no arguments to a graph without parameters); None when this
    version of PyTorch wraps otherwise (the caller's trial call checks that the list comes back empty)."""
    wrapped: Any = function
    while wrapped is not None:
        if getattr(wrapped, "__qualname__", "").endswith("runtime_wrapper") and getattr(wrapped, "_boxed_call", False):
            return wrapped
        wrapped = getattr(wrapped, "__wrapped__", None)
    return None
