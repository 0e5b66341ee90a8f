"""Contract the joint fx graph into planning nodes: one node per op that allocates memory.

An fx node whose value lives in storage that an earlier value already owns (a view, `getitem` of a
multi-output op, `detach`, `alias`) allocates nothing. It joins the planning node that owns that
storage, so a multi-output op and all its views form one node. A view of a parameter or batch input
(say, a transposed weight) belongs to no node: the graph is rewritten so that each use gets its own
copy of it, and the copy joins the node that reads it. Every fx node then belongs to exactly one
planning node, and the planning nodes in fx order of their first allocating op form a valid
topological order.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import torch

from checkmate.torch_capture.sizes import StorageKey, StorageTable, storage_table

log = logging.getLogger(__name__)

_SOURCE_OPS = ("placeholder", "get_attr")


@dataclass(frozen=True)
class StorageOwners:
    """Which fx node first allocated each storage; sources (placeholders, constants) own theirs as None."""

    table: StorageTable
    owner: dict[StorageKey, str | None]
    allocating: frozenset[str]


def find_owners(graph: torch.fx.Graph) -> StorageOwners:
    """Walk the graph in order and record, for each storage, the fx node that created it."""
    table = storage_table(graph)
    owner: dict[StorageKey, str | None] = {}
    allocating: set[str] = set()
    for node in graph.nodes:
        storages = table.storages(node.name)
        if node.op in _SOURCE_OPS:
            owner.update(dict.fromkeys(storages, None))
        elif node.op == "call_function":
            new = [key for key in storages if key not in owner]
            owner.update(dict.fromkeys(new, node.name))
            if new:
                allocating.add(node.name)
    return StorageOwners(table, owner, frozenset(allocating))


def _owners_of(node: torch.fx.Node, owners: StorageOwners) -> set[str]:
    return {name for key in owners.table.storages(node.name) if (name := owners.owner.get(key)) is not None}


def prepare_graph(module: torch.fx.GraphModule) -> None:
    """Drop unused non-allocating nodes and give each use of a source view its own copy (in place)."""
    graph = module.graph
    owners = find_owners(graph)
    for node in reversed(list(graph.nodes)):
        if node.op != "call_function" or node.name in owners.allocating:
            continue
        if not node.users:
            graph.erase_node(node)
        elif not _owners_of(node, owners):
            _copy_per_user(graph, node)
    graph.lint()
    module.recompile()


def _copy_per_user(graph: torch.fx.Graph, node: torch.fx.Node) -> None:
    users = [user for user in node.users if user.op != "output"]
    keep_original = len(users) == len(node.users)
    for user in users[1:] if keep_original else users:
        with graph.inserting_before(user):
            copy = graph.node_copy(node)
        user.replace_input_with(node, copy)


def assign_groups(graph: torch.fx.Graph) -> list[list[str]]:
    """Partition the call nodes of a prepared graph into planning nodes; each list is in fx order."""
    owners = find_owners(graph)
    calls = [node for node in graph.nodes if node.op == "call_function"]
    order = {node.name: index for index, node in enumerate(calls)}
    group_of: dict[str, int] = {}
    anchors: list[str] = []
    for node in calls:
        if node.name in owners.allocating:
            group_of[node.name] = len(anchors)
            anchors.append(node.name)
        elif owned_by := _owners_of(node, owners):
            readers = [argument.name for argument in node.all_input_nodes if argument.name in group_of]
            group_of[node.name] = max(group_of[name] for name in (*owned_by, *readers))
    for node in reversed(calls):
        if node.name in group_of:
            continue
        users = [user for user in node.users if user.op != "output"]
        if users:
            group_of[node.name] = group_of[users[0].name]
        else:
            group_of[node.name] = len(anchors)
            anchors.append(node.name)
    first_index = sorted(range(len(anchors)), key=lambda group: order[anchors[group]])
    renumber = {old: new for new, old in enumerate(first_index)}
    groups: list[list[str]] = [[] for _ in anchors]
    for node in calls:
        groups[renumber[group_of[node.name]]].append(node.name)
    return groups


def absorb_short_lived_outputs(graph: torch.fx.Graph, groups: list[list[str]], loss: str) -> list[list[str]]:
    """Join a multi-output op's node with the one node that alone reads one of its outputs, where legal.

    A planning node keeps all its exported values together, so BatchNorm's big normalized output
    would otherwise live as long as its small saved statistics (read by the backward pass). When
    one node alone reads such an output, the two become one node and the output becomes internal:
    the reader moves up to the op when it reads nothing computed after the op (BatchNorm -> ReLU),
    else the op moves down to the reader when nothing in between reads the op (a ResNet block's
    second BatchNorm, whose reader, the skip addition, also reads the shortcut computed after it).
    Both must be on the same side of the loss.
    """
    owners = find_owners(graph)
    nodes = {node.name: node for node in graph.nodes}
    order = {node.name: index for index, node in enumerate(graph.nodes)}
    group_of = {name: index for index, names in enumerate(groups) for name in names}
    merged: list[list[str] | None] = [list(names) for names in groups]
    for index in range(len(groups)):
        while (found := _sole_reader(index, merged, group_of, nodes, owners, group_of[loss])) is not None:
            reader, move_reader_up = found
            source, destination = (reader, index) if move_reader_up else (index, reader)
            members = merged[source] or []
            for name in members:
                group_of[name] = destination
            merged[destination] = sorted([*(merged[destination] or []), *members], key=order.__getitem__)
            merged[source] = None
            if not move_reader_up:
                break
    return [names for names in merged if names is not None]


def _sole_reader(
    index: int,
    groups: list[list[str] | None],
    group_of: dict[str, int],
    nodes: dict[str, torch.fx.Node],
    owners: StorageOwners,
    loss_group: int,
) -> tuple[int, bool] | None:
    """A node that alone reads one output of node `index`, and whether it moves up (else `index` moves down)."""
    members = groups[index]
    if members is None:
        return None
    readers_of: dict[StorageKey, set[int]] = {}
    for name in members:
        for user in nodes[name].users:
            if user.op != "output" and group_of[user.name] != index:
                for storage in owners.table.storages(name):
                    if owners.owner.get(storage) is not None:
                        readers_of.setdefault(storage, set()).add(group_of[user.name])
    if len(readers_of) < 2:
        return None
    first_reader = min(min(readers) for readers in readers_of.values())
    for _, readers in sorted(readers_of.items()):
        reader = next(iter(readers))
        if len(readers) != 1 or reader < index or (reader > loss_group) != (index > loss_group):
            continue
        reads = {
            group_of[argument.name]
            for name in groups[reader] or []
            for argument in nodes[name].all_input_nodes
            if argument.name in group_of
        }
        if max(reads - {reader}, default=index) <= index:
            return reader, True
        if reader == first_reader:
            return reader, False
    return None
