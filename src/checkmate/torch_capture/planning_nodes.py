"""Turn a partition of the joint fx graph into the planning Graph: edges, exports, memory, phase, randomness.

A planning node's memory is the bytes of the storages its exported values live in (each storage
once, views free), leaving out storages of parameters, buffers and batch inputs, and of values that
leave the step (the loss, parameter gradients, buffer updates): those sit in the graph's fixed memory.

A node that stands for several fx ops also makes values nobody outside it reads (say, the BatchNorm
output inside BatchNorm + add + ReLU). They live from the op that makes them to their last reader
inside the node, as the executor frees them. The node's workspace is how far its live storages rise
above its exported bytes while it runs: max over its ops of the bytes live at that op, minus its memory.
The bytes live at an op include its scratch: memory the kernel allocates inside itself and frees before
it returns, beyond its output (measured by the "profile" cost model, see `checkmate.torch_capture.profile`;
0 under the other cost models, which run nothing).
A parameter gradient counts there too, from its op to its last reader: a step that accumulates into an
existing `.grad` holds the new gradient beside it until it is added, so the plan holds whether `.grad`
is set or not (when it is not, the gradient is counted twice for that moment). A step planned for empty
`.grad`s (`gradient_memory="when_made"`) counts gradients neither in the fixed memory nor in a workspace: the
node that makes them retains them (`Node.retained`) from its first run to the end. A recomputation makes
every value that leaves the step once more, as a temporary (the first run's copies are the fixed
memory), so the recompute workspace counts the loss and buffer updates too.
"""

from __future__ import annotations

import itertools
import logging
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

import torch

from checkmate.captured import last_uses
from checkmate.errors import CaptureError
from checkmate.graph import Graph, Node
from checkmate.torch_capture.grouping import find_owners
from checkmate.torch_capture.sizes import StorageKey, StorageTable

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class PlanningNodes:
    """A planning graph together with its tie to the fx graph (see `checkmate.captured`)."""

    graph: Graph
    members: tuple[tuple[str, ...], ...]
    exports: tuple[tuple[str, ...], ...]
    random_nodes: frozenset[int]


def build_planning_nodes(
    module: torch.fx.GraphModule,
    groups: Sequence[Sequence[str]],
    costs: Sequence[float],
    *,
    loss: str,
    fixed_outputs: frozenset[str],
    gradients: frozenset[str] = frozenset(),
    extra_fixed_memory: int = 0,
    scratch: Mapping[str, int] | None = None,
    retain_gradients: bool = False,
    random_state_bytes: int = 0,
) -> PlanningNodes:
    """Build the planning graph of `groups` (fx names per planning node, in order) priced by `costs`.

    Fixed memory is the bytes of parameters, buffers, batch inputs, constants and the `fixed_outputs`
    (the loss, parameter gradients, buffer updates), each storage once, plus `extra_fixed_memory`.
    `gradients` (among the fixed outputs) are also counted in the workspace of the node that makes them.
    `scratch` (fx name -> bytes; absent means 0) is what each op holds inside its kernel while it runs.
    With `retain_gradients` (a step whose `.grad`s start empty) the gradients leave the fixed memory and each
    planning node retains the gradients it makes (`Node.retained`), from its first run to the end of the step.
    A random node also retains `random_state_bytes`: the executor saves the generator's state before its first run,
    to replay it when the node is recomputed, and keeps it to the end of the step. A recomputation of it holds
    `random_state_bytes` more while it runs: the copy of the generator's current state that `torch.random.fork_rng`
    restores afterwards.
    """
    scratch = scratch or {}
    nodes_by_name = {node.name: node for node in module.graph.nodes}
    group_of = {name: index for index, names in enumerate(groups) for name in names}
    order = {node.name: index for index, node in enumerate(module.graph.nodes)}
    exports, inputs = _edges(groups, group_of, nodes_by_name)
    owners = find_owners(module.graph)
    sources = _storages_of(
        (node.name for node in module.graph.nodes if node.op in ("placeholder", "get_attr")), owners.table
    )
    held = sources | _storages_of(fixed_outputs - gradients, owners.table)
    gradient_storages = _storages_of(gradients, owners.table)
    excluded = held | gradient_storages
    retained_gradients = _retained_bytes(gradients, group_of, owners.table, held) if retain_gradients else {}
    random_nodes = frozenset(
        index for index, names in enumerate(groups) if any(is_random(nodes_by_name[name]) for name in names)
    )
    first_run_excluded = excluded if retain_gradients else held  # retained gradients are not workspace
    loss_group = group_of[loss]
    graph_nodes = []
    for index, names in enumerate(groups):
        memory = _export_bytes(exports[index], owners.table, excluded)
        workspace = max(
            0, _running_peak(names, exports[index], nodes_by_name, owners.table, first_run_excluded, scratch) - memory
        )
        again = max(0, _running_peak(names, exports[index], nodes_by_name, owners.table, sources, scratch) - memory)
        if index in random_nodes:
            again += random_state_bytes  # replaying: `fork_rng` holds a copy of the generator's current state
        graph_nodes.append(
            Node(
                name=_label(names, owners.allocating),
                cost=float(costs[index]),
                memory=memory,
                backward=index > loss_group,
                inputs=tuple(sorted(inputs[index])),
                workspace=workspace,
                recompute_workspace=None if again == workspace else again,
                retained=retained_gradients.get(index, 0) + (random_state_bytes if index in random_nodes else 0),
            )
        )
    fixed_memory = sum(excluded.values()) - sum(retained_gradients.values()) + extra_fixed_memory
    return PlanningNodes(
        graph=Graph(tuple(graph_nodes), fixed_memory=fixed_memory),
        members=tuple(tuple(names) for names in groups),
        exports=tuple(tuple(sorted(names, key=order.__getitem__)) for names in exports),
        random_nodes=random_nodes,
    )


def _retained_bytes(
    gradients: frozenset[str], group_of: dict[str, int], table: StorageTable, held: dict[StorageKey, int]
) -> dict[int, int]:
    """Bytes of gradient storages per planning node that makes them (each storage once, by its first maker; none
    that is also fixed memory)."""
    maker: dict[StorageKey, int] = {}
    for name in gradients:
        for key in table.storages(name):
            if key not in held:
                maker[key] = min(maker.get(key, group_of[name]), group_of[name])
    retained: dict[int, int] = {}
    for key, index in maker.items():
        retained[index] = retained.get(index, 0) + table.sizes[key]
    return retained


def _edges(
    groups: Sequence[Sequence[str]], group_of: dict[str, int], nodes_by_name: dict[str, torch.fx.Node]
) -> tuple[list[set[str]], list[set[int]]]:
    """For each planning node, the fx values other nodes read from it, and the planning nodes it reads."""
    exports: list[set[str]] = [set() for _ in groups]
    inputs: list[set[int]] = [set() for _ in groups]
    for index, names in enumerate(groups):
        for name in names:
            for argument in nodes_by_name[name].all_input_nodes:
                source = group_of.get(argument.name)
                if source is None or source == index:
                    continue
                if source > index:
                    raise CaptureError(
                        f"internal: fx node {name!r} (planning node {index}) reads {argument.name!r} of the later "
                        f"planning node {source}; please report this model"
                    )
                exports[source].add(argument.name)
                inputs[index].add(source)
    return exports, inputs


def is_random(node: torch.fx.Node) -> bool:
    """True for ops that draw from the random generator (dropout, bernoulli, rand*, randn*, ...)."""
    target = node.target
    return isinstance(target, torch._ops.OpOverload) and torch.Tag.nondeterministic_seeded in target.tags


def _storages_of(names: Iterable[str], table: StorageTable) -> dict[StorageKey, int]:
    storages: dict[StorageKey, int] = {}
    for name in names:
        storages.update(table.storages(name))
    return storages


def _export_bytes(values: set[str], table: StorageTable, excluded: dict[StorageKey, int]) -> int:
    return sum(size for key, size in _storages_of(values, table).items() if key not in excluded)


def _running_peak(
    names: Sequence[str],
    exports: set[str],
    nodes_by_name: dict[str, torch.fx.Node],
    table: StorageTable,
    excluded: dict[StorageKey, int],
    scratch: Mapping[str, int],
) -> int:
    """The most bytes of the node's own storages, plus the running op's scratch, live at once while its ops run.

    A value lives from its op to its last reader among the node's ops (the executor drops it after that op),
    or to the node's end when it is exported. A storage lives while any value in it does.
    """
    computed = [name for name in names if nodes_by_name[name].op == "call_function"]
    last_use = last_uses(computed, nodes_by_name)
    for name in exports:
        last_use[name] = len(computed) - 1
    born: dict[StorageKey, int] = {}
    dies: dict[StorageKey, int] = {}
    for index, name in enumerate(computed):
        for key in table.storages(name):
            if key not in excluded:
                born[key] = min(born.get(key, index), index)
                dies[key] = max(dies.get(key, last_use[name]), last_use[name])
    change = [0] * (len(computed) + 1)
    for key, start in born.items():
        change[start] += table.sizes[key]
        change[dies[key] + 1] -= table.sizes[key]
    live = itertools.accumulate(change[:-1])  # bytes live while op k runs; the last entry only frees
    return max((bytes_live + scratch.get(name, 0) for name, bytes_live in zip(computed, live, strict=True)), default=0)


def _label(names: Sequence[str], allocating: frozenset[str]) -> str:
    """The first allocating member's fx name, or "first..last" for a node merged from several ops."""
    anchors = [name for name in names if name in allocating] or list(names[:1])
    return anchors[0] if len(anchors) == 1 else f"{anchors[0]}..{anchors[-1]}"
