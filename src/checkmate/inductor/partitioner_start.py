"""torch.compile's own choice of what to save, as starting plans of our search.

torch.compile splits a training step with AOTAutograd's min-cut partitioner
(`torch._functorch.partitioners.min_cut_rematerialization_partition`): the forward function returns, beside its own
outputs, the values the backward reads from memory (the saved set); the backward computes the rest again.
`torch._functorch.config.activation_memory_budget` (1 = the fastest split, 0 = save only the inputs) sets how much
it may save. `partitioner_starts` runs that partitioner on a copy of a capture's joint graph at the levels that a
bisection for a budget tries, and hands each saved set to the search as the planning nodes it holds
(`checkmate.strategies.held_start.HeldStart`), priced by the same graph as every other plan: the search's answer then
costs at most the cheapest of them within the budget.

The joint graph is put in the form the partitioner reads: the gradient seed of the loss (`ones_like(loss)`) becomes
the placeholder `tangents_1` (the other placeholders count as primals by their names), and the outputs before the
first gradient are the forward outputs. A forward planning node is held when every value of it that the backward
reads is saved, or a view of saved values or of inputs; otherwise the backward computes it again. A level at which
the partitioner fails is logged and skipped.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from functools import cache

import torch
from torch._functorch import config as functorch_config
from torch._functorch.partitioners import min_cut_rematerialization_partition

from checkmate.captured import Captured
from checkmate.strategies.held_start import HeldStart, held_start_plan
from checkmate.torch_capture.grouping import find_owners

log = logging.getLogger(__name__)

# The activation_memory_budget values tried: benchmarks/peers.py's levels and the halves between them. Distinct
# saved sets are few (neighbouring levels often agree), and each level costs one min-cut of the joint graph.
LEVELS = (1.0, 0.8, 0.6, 0.5, 0.4, 0.3, 0.2, 0.1, 0.0)

_TANGENT = "tangents_1"


class PartitionerInputError(ValueError):
    """The capture's joint graph cannot be put in the form the partitioner reads."""


def partitioner_starts(captured: Captured, budget: int, levels: Sequence[float] = LEVELS) -> tuple[HeldStart, ...]:
    """The held sets of torch.compile's partitioner (module doc) at the levels a bisection of `levels` (highest
    first) tries in search of the highest whose plan fits `budget` bytes: its plan peaks lower as the level falls,
    and costs more, so that level's plan is the one to beat, found in about log2(len(levels)) partitions. Each
    distinct set comes once, under the first level that gave it; a level at which the partitioner fails counts as
    not fitting (logged)."""
    started = time.perf_counter()
    reads = backward_reads(captured)
    starts: dict[tuple[int, ...], HeldStart] = {}
    tried: list[float] = []

    def fits(position: int) -> bool:
        level = levels[position]
        tried.append(level)
        try:
            saved = saved_values(captured, level)
        except Exception as error:  # the partitioner failing on a graph costs only its start, never the compile
            log.warning("torch.compile's partitioner at activation_memory_budget=%s failed (%s); skipped", level, error)
            return False
        held = held_nodes(captured, reads, saved)
        start = starts.setdefault(held, HeldStart(f"torch.compile partitioner, activation_memory_budget={level}", held))
        return held_start_plan(captured.graph, start, method=start.label).peak_memory <= budget

    below, fitting = -1, len(levels)  # levels[below] does not fit (or is none), levels[fitting] fits (or is none)
    while fitting - below > 1:
        middle = (below + fitting) // 2
        below, fitting = (below, middle) if fits(middle) else (middle, fitting)
    log.info(
        "torch.compile's partitioner: %s fits the budget; activation_memory_budget %s tried in %.2f s",
        "no level" if fitting == len(levels) else f"activation_memory_budget={levels[fitting]}",
        ", ".join(map(str, tried)),
        time.perf_counter() - started,
    )
    return tuple(starts.values())


def saved_values(captured: Captured, level: float) -> frozenset[str]:
    """The fx names of the values the partitioner saves for the backward at `activation_memory_budget=level`.

    Raises:
        PartitionerInputError: the graph has no gradient seed of the loss to turn into a tangent.
    """
    joint, forward_outputs = _partitioner_joint(captured)
    with functorch_config.patch(activation_memory_budget=level):
        forward, _ = min_cut_rematerialization_partition(joint, None, num_fwd_outputs=forward_outputs)
    (output,) = forward.graph.find_nodes(op="output")
    returned = list(output.args[0])
    return frozenset(node.name for node in returned[forward_outputs:] if isinstance(node, torch.fx.Node))


def backward_reads(captured: Captured) -> dict[int, frozenset[str]]:
    """For each forward planning node that the backward reads, the fx names of the values it reads (the gradient
    seed's read of the loss aside: the partitioner's backward gets the seed as a tangent)."""
    is_backward = captured.graph.is_backward
    seed = _seed(captured.module.graph, captured.loss)
    nodes = _fx_nodes(captured.module)
    reads: dict[int, set[str]] = {}
    for index, members in enumerate(captured.members):
        if not is_backward[index]:
            continue
        for member in members:
            if seed is not None and member == seed.name:
                continue
            for argument in nodes[member].all_input_nodes:
                producer = captured.node_of.get(argument.name)
                if producer is not None and not is_backward[producer]:
                    reads.setdefault(producer, set()).add(argument.name)
    return {index: frozenset(names) for index, names in reads.items()}


def held_nodes(captured: Captured, reads: dict[int, frozenset[str]], saved: frozenset[str]) -> tuple[int, ...]:
    """The forward planning nodes whose values read by the backward are all available there: saved, placeholders,
    or views (ops that allocate nothing) of available values."""
    nodes = _fx_nodes(captured.module)
    allocating = find_owners(captured.module.graph).allocating

    @cache
    def available(name: str) -> bool:
        node = nodes[name]
        if name in saved or node.op == "placeholder":
            return True
        if node.op != "call_function" or name in allocating:
            return False
        return all(available(argument.name) for argument in node.all_input_nodes)

    return tuple(sorted(index for index, values in reads.items() if all(available(name) for name in values)))


def _partitioner_joint(captured: Captured) -> tuple[torch.fx.GraphModule, int]:
    """A copy of the capture's joint graph as the partitioner reads it, and its number of forward outputs."""
    graph = torch.fx.Graph()
    returned = graph.graph_copy(captured.module.graph, {})
    if not any(node.op == "placeholder" and "tangents" in str(node.target) for node in graph.nodes):
        seed = _seed(graph, captured.loss)
        if seed is None:
            raise PartitionerInputError(f"no gradient seed ones_like({captured.loss}) in the joint graph")
        first = next(node for node in graph.nodes if node.op != "placeholder")
        with graph.inserting_before(first):
            tangent = graph.placeholder(_TANGENT)
        tangent.meta = dict(seed.meta)
        seed.replace_all_uses_with(tangent)
        graph.erase_node(seed)
    graph.output(returned)
    outputs = list(returned) if isinstance(returned, (tuple, list)) else [returned]
    gradients = {name for name in (*captured.gradients, *captured.input_gradients) if name is not None}
    forward_outputs = next(
        (
            position
            for position, node in enumerate(outputs)
            if not isinstance(node, torch.fx.Node) or node.name in gradients
        ),
        len(outputs),
    )
    return torch.fx.GraphModule(captured.module, graph), forward_outputs


def _seed(graph: torch.fx.Graph, loss: str) -> torch.fx.Node | None:
    """The backward's seed: `ones_like(loss)`, the gradient of the loss with respect to itself; None when absent."""
    for node in graph.find_nodes(op="call_function", target=torch.ops.aten.ones_like.default):
        if isinstance(node.args[0], torch.fx.Node) and node.args[0].name == loss:
            return node
    return None


def _fx_nodes(module: torch.fx.GraphModule) -> dict[str, torch.fx.Node]:
    return {node.name: node for node in module.graph.nodes}
