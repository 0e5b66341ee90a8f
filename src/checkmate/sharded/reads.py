"""Which graph nodes of a captured step read which units' parameters, and which make which units' gradients.

A node reads a parameter when one of its member operations takes the parameter's placeholder or a value that shares
its storage: a view of it (`t`, `view`, `expand`, a `split` piece, `_unsafe_view`), a view of that, and so on. Views
matter because a free empties the parameter's storage, and every view of it with it.
"""

from __future__ import annotations

import logging
import operator
from collections.abc import Sequence

import torch
import torch.fx

from checkmate.captured import Captured
from checkmate.sharded.timeline import UnitUse

log = logging.getLogger(__name__)

# ATen ops whose output shares its input's storage at run time although their schema does not say so
_UNMARKED_VIEWS = frozenset({torch.ops.aten._unsafe_view.default})


def unit_use(captured: Captured, unit_of: Sequence[int], reshard_after_forward: tuple[bool, ...]) -> UnitUse:
    """What the captured step does with the units' parameters, per graph node.

    Args:
        captured: the step captured on the unsharded model.
        unit_of: the unit of each captured parameter, in placeholder order.
        reshard_after_forward: per unit, whether FSDP2 frees its parameters after its forward.
    """
    graph = captured.module.graph
    placeholders = [node.name for node in graph.nodes if node.op == "placeholder"]
    holds: dict[str, frozenset[int]] = {
        name: frozenset({unit_of[index]}) for index, name in enumerate(placeholders[: len(unit_of)])
    }
    for node in graph.nodes:
        if node.op == "call_function" and _aliases_input(node):
            shared = frozenset().union(*(holds.get(argument.name, frozenset()) for argument in node.all_input_nodes))
            if shared:
                holds[node.name] = shared
    fx_nodes = {node.name: node for node in graph.nodes}
    reads = tuple(
        frozenset().union(
            *(holds.get(argument.name, frozenset()) for name in members for argument in fx_nodes[name].all_input_nodes)
        )
        for members in captured.members
    )
    gradients: list[set[int]] = [set() for _ in captured.members]
    for parameter, gradient in enumerate(captured.gradients):
        if gradient is not None:
            gradients[captured.node_of[gradient]].add(unit_of[parameter])
    return UnitUse(
        reads=reads,
        gradients=tuple(frozenset(units) for units in gradients),
        last_forward_stage=captured.node_of[captured.loss],
        reshard_after_forward=reshard_after_forward,
    )


def _aliases_input(node: torch.fx.Node) -> bool:
    """Whether the fx node's value may share storage with one of its inputs."""
    target = node.target
    if target is operator.getitem:
        return True
    if not isinstance(target, torch._ops.OpOverload):
        return True  # unknown: assume it may
    if target in _UNMARKED_VIEWS or target.is_view:
        return True
    return any(returned.alias_info is not None for returned in target._schema.returns)
