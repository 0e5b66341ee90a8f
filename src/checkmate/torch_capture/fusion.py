"""Group the joint graph's ops as Inductor fuses them, so that a planning node is one fused kernel.

Inductor turns a chain of pointwise and reduction ops into one generated loop nest: the values inside the chain
are never materialized. Library kernels (convolutions, matrix products, attention) stay calls of their own
("extern kernels"), and so do the ops that draw random numbers here (`checkmate.inductor` runs them as ATen ops, so
that their masks are eager's and a recomputation replays them).

`fuse_groups` merges a planning node of pointwise ops into the node that reads it when that reader is fusible and is
its only one: as in Inductor's generated code, a pointwise producer is computed inside its consumer's loop, and its
values become the reader's internal values, which the plan neither counts as memory nor can keep apart. A value with
several readers stays a node of its own even where Inductor would compute it inside its first reader's kernel: a
planning node's values are kept and freed together, so joining it to that reader would tie its lifetime to the
reader's outputs (on VGG that raises the peak without recomputation).
Nodes whose output Inductor materializes (reductions, gathers such as max-pooling's backward) stay apart: joined to
their reader they would save nothing and keep the reader's other inputs alive longer. Only single-reader chains are
merged, so no merge can create a cycle (every path out of the merged node went through the reader), and nodes on
different sides of the loss stay apart (a forward value never moves into the backward pass).
"""

from __future__ import annotations

import operator
from collections.abc import Sequence

import torch

from checkmate.torch_capture.planning_nodes import is_random

# Ops Inductor calls as library kernels on CPU and CUDA, by the ATen name's stem: nothing fuses into them.
EXTERN_KERNELS = ("convolution", "mm", "addmm", "bmm", "baddbmm", "scaled_dot_product", "attention", "linear")


def is_extern(node: torch.fx.Node) -> bool:
    """Whether Inductor runs this fx node as a library kernel, a fusion boundary."""
    return any(_calls(node, kernel) for kernel in EXTERN_KERNELS)


def _calls(node: torch.fx.Node, kernel: str) -> bool:
    """Whether the fx node is an ATen op of the library kernel `kernel` (a stem of EXTERN_KERNELS): the kernel itself,
    a variant (`convolution_backward`) or a backend's (`mkldnn_convolution`)."""
    target = node.target
    if not isinstance(target, torch._ops.OpOverload):
        return False
    stem = target._schema.name.removeprefix("aten::")
    return stem == kernel or stem.startswith(kernel) or f"_{kernel}" in stem


def fusible(names: Sequence[str], nodes: dict[str, torch.fx.Node]) -> bool:
    """A planning node Inductor can fuse with its neighbours: no library kernel, no random op."""
    return not any(is_extern(nodes[name]) or is_random(nodes[name]) for name in names)


def convolution_call(names: Sequence[str], nodes: dict[str, torch.fx.Node]) -> bool:
    """A planning node that is one convolution (forward or backward) and ops that allocate nothing (views, `getitem`
    of its outputs): nothing in it can fuse, and Inductor compiles it to the same library call, in a layout it picks
    (with copies around the call where the trace's layout differs)."""
    computed = [nodes[name] for name in names if nodes[name].op == "call_function"]
    convolutions = [_calls(node, "convolution") for node in computed]
    return sum(convolutions) == 1 and all(
        convolution or node.target is operator.getitem or _is_view(node)
        for node, convolution in zip(computed, convolutions, strict=True)
    )


def _is_view(node: torch.fx.Node) -> bool:
    return isinstance(node.target, torch._ops.OpOverload) and node.target.is_view


def inlinable(names: Sequence[str], nodes: dict[str, torch.fx.Node]) -> bool:
    """A planning node Inductor inlines into its reader: pointwise ops and views only (a reduction's or a gather's
    output is materialized, so joining it to its reader would only keep the reader's inputs alive longer)."""
    return fusible(names, nodes) and all(_inlined(nodes[name]) for name in names)


def _inlined(node: torch.fx.Node) -> bool:
    target = node.target
    return not isinstance(target, torch._ops.OpOverload) or target.is_view or torch.Tag.pointwise in target.tags


def fuse_groups(graph: torch.fx.Graph, groups: Sequence[Sequence[str]], loss: str) -> list[list[str]]:
    """Merge each pointwise planning node into its only reader when that reader is fusible and on the same side of
    the loss; in order, so a chain of pointwise ops becomes one node. Groups stay in fx order of their members."""
    nodes = {node.name: node for node in graph.nodes}
    order = {node.name: index for index, node in enumerate(graph.nodes)}
    group_of = {name: index for index, names in enumerate(groups) for name in names}
    merged: list[list[str] | None] = [list(names) for names in groups]
    loss_group = group_of[loss]
    for index in range(len(groups)):
        members = merged[index]
        if members is None or not inlinable(members, nodes):
            continue
        readers = {
            group_of[user.name]
            for name in members
            for user in nodes[name].users
            if user.op != "output" and group_of[user.name] != index
        }
        if len(readers) != 1:
            continue
        (reader,) = readers
        target = merged[reader]
        if target is None or not fusible(target, nodes) or (index > loss_group) != (reader > loss_group):
            continue
        if index == loss_group:
            continue
        for name in members:
            group_of[name] = reader
        merged[reader] = sorted([*target, *members], key=order.__getitem__)
        merged[index] = None
    return [names for names in merged if names is not None]
