"""The planning graph priced by the compiled nodes as measured: what they cost and hold, not what their ATen ops do.

For node i, from its function's measure (`checkmate.inductor.measure`):

* memory: bytes of the storages holding its exports (values that are also step outputs excluded: the fixed memory
  counts those), as the function returned them;
* workspace: how far the allocator rose during its first call above that memory, less the loss and buffer updates
  it returns (fixed memory) and the gradients it retains (`Node.retained`);
* recompute workspace: the rise above its memory on a recomputation, where everything else it returns is a temporary;
* cost: the median call time, when the plan is priced by measurement (`reprice_costs`), else the capture's cost;
* recompute cost (priced by measurement only): a recomputation of a node Inductor fuses (compiled, no library kernel,
  no random op) whose readers are all fusible runs inside its reader's kernel in a fused run of the schedule
  (`checkmate.inductor.segments`), so it saves what keeping its value costs: allocating, writing and reading back its
  memory (`checkmate.inductor.memory_traffic`). Its cost is the call time less that, at least nothing. Any other
  node's recomputation is a call of its own and costs what its first run does.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from checkmate.captured import Captured
from checkmate.graph import Graph, Node
from checkmate.inductor.kernels import NodeKernel
from checkmate.inductor.measure import KernelMeasure
from checkmate.inductor.memory_traffic import MemoryTraffic
from checkmate.torch_capture.fusion import fusible


def priced_graph(
    captured: Captured,
    kernels: Sequence[NodeKernel],
    measures: Sequence[KernelMeasure],
    *,
    traffic: MemoryTraffic | None,
) -> Graph:
    """`captured.graph` with each node's memory and workspaces from its measure, and its costs too when `traffic`
    is given (the plan is priced by measurement)."""
    held = {captured.loss, *filter(None, captured.buffer_updates), *captured.region_outputs}
    fixed = held | set(filter(None, (*captured.gradients, *captured.input_gradients)))
    nodes = [
        _priced(node, kernel, measure, set(exports), fixed, held, reprice_costs=traffic is not None)
        for node, kernel, measure, exports in zip(
            captured.graph.nodes, kernels, measures, captured.exports, strict=True
        )
    ]
    graph = dataclasses.replace(captured.graph, nodes=tuple(nodes))
    if traffic is None:
        return graph
    fx_nodes = {node.name: node for node in captured.module.graph.nodes}
    fuses = [
        kernel.compiled and fusible(members, fx_nodes)
        for kernel, members in zip(kernels, captured.members, strict=True)
    ]
    for index, node in enumerate(nodes):
        if fuses[index] and graph.users[index] and all(fuses[user] for user in graph.users[index]):
            nodes[index] = dataclasses.replace(node, recompute_cost=max(0.0, node.cost - traffic.cost(node.memory)))
    return dataclasses.replace(graph, nodes=tuple(nodes))


def _priced(
    node: Node,
    kernel: NodeKernel,
    measure: KernelMeasure,
    exports: set[str],
    fixed: set[str],
    held: set[str],
    *,
    reprice_costs: bool,
) -> Node:
    storage_of = dict(zip(kernel.outputs, measure.output_storages, strict=True))
    fixed_storages = {storage_of[name] for name in kernel.outputs if name in fixed}
    memory_storages = {
        storage_of[name] for name in kernel.outputs if name in exports and storage_of[name] not in fixed_storages
    } - {-1}
    held_storages = {storage_of[name] for name in kernel.outputs if name in held} - memory_storages - {-1}
    memory = sum(measure.storage_bytes[storage] for storage in memory_storages)
    held_bytes = sum(measure.storage_bytes[storage] for storage in held_storages)
    workspace = max(0, measure.peak_bytes - memory - held_bytes - node.retained)
    again = max(0, measure.peak_bytes - memory)
    return dataclasses.replace(
        node,
        cost=measure.seconds if reprice_costs else node.cost,
        memory=memory,
        workspace=workspace,
        recompute_workspace=None if again == workspace else again,
    )
