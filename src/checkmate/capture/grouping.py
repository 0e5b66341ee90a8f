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

from checkmate.capture.sizes import StorageKey, StorageTable, storage_table

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
    """Move into a multi-output op's node the one node that alone reads one of its outputs, where legal.

    A planning node keeps all its exported values together, so BatchNorm's big normalized output
    would otherwise live as long as its small saved statistics (read by the backward pass). When
    one node alone reads such an output and reads nothing computed later, it is evaluated with the
    op instead, and the output becomes internal. Both must be on the same side of the loss.
    """
    owners = find_owners(graph)
    nodes = {node.name: node for node in graph.nodes}
    order = {node.name: index for index, node in enumerate(graph.nodes)}
    group_of = {name: index for index, names in enumerate(groups) for name in names}
    merged: list[list[str] | None] = [list(names) for names in groups]
    for index in range(len(groups)):
        while (target := _sole_reader(index, merged, group_of, nodes, owners, group_of[loss])) is not None:
            members = merged[target]
            assert members is not None
            for name in members:
                group_of[name] = index
            merged[index] = sorted([*(merged[index] or []), *members], key=order.__getitem__)
            merged[target] = None
    return [names for names in merged if names is not None]


def _sole_reader(
    index: int,
    groups: list[list[str] | None],
    group_of: dict[str, int],
    nodes: dict[str, torch.fx.Node],
    owners: StorageOwners,
    loss_group: int,
) -> int | None:
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
    for _, readers in sorted(readers_of.items()):
        if len(readers) != 1:
            continue
        reader = next(iter(readers))
        reads = {
            group_of[argument.name]
            for name in groups[reader] or []
            for argument in nodes[name].all_input_nodes
            if argument.name in group_of
        }
        same_side = (reader > loss_group) == (index > loss_group)
        if reader > index and same_side and max(reads - {reader}, default=index) <= index:
            return reader
    return None
