"""A planning graph from a joint graph that AOTAutograd made, as a `torch.compile` backend receives it.

Inside `torch.compile`, AOTAutograd traces the compiled region's forward and backward into one joint graph and hands
it to a partition function (`checkmate.inductor.backend`): its placeholders are the primals (the region's inputs:
parameters, buffers, the user's tensors) and the tangents (the gradients of the region's outputs, known only when
the backward runs); its outputs are the forward outputs (the region's outputs and the new values of mutated inputs)
and then a gradient, or None, per primal.

`capture_joint` turns that graph into a `Captured` with the capture stages of `checkmate.capture` (grouping into
nodes, fused as Inductor fuses, FLOP costs, planning nodes). The forward outputs play the loss's part: they leave the
region when the forward ends, so they are fixed memory, and the last of them is where the forward ends. The gradients
leave it when the backward ends, so each is retained from the node that makes it (as with
`gradient_memory="when_made"`).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from checkmate.captured import Captured
from checkmate.errors import CaptureError
from checkmate.torch_capture.costs import flops_per_op, group_costs
from checkmate.torch_capture.fusion import fuse_groups
from checkmate.torch_capture.grouping import absorb_short_lived_outputs, assign_groups, find_owners, prepare_graph
from checkmate.torch_capture.planning_nodes import build_planning_nodes


def capture_joint(
    module: torch.fx.GraphModule,
    forward_outputs: Sequence[str],
    gradients: Sequence[str | None],
    *,
    device: torch.device,
    random_state_bytes: int,
) -> Captured:
    """The planning graph of an AOTAutograd joint graph (changed in place: unused views dropped).

    Args:
        module: the joint graph.
        forward_outputs: fx names of its forward outputs, in order.
        gradients: the fx name of each primal's gradient, or None.
        device: where it runs.
        random_state_bytes: bytes of the generator state saved per random node (see `build_planning_nodes`).

    Raises:
        CaptureError: no forward output is computed by the graph (nothing to plan).
    """
    prepare_graph(module)
    nodes = {node.name: node for node in module.graph.nodes}
    computed = [name for name in forward_outputs if nodes[name].op == "call_function"]
    if not computed:
        raise CaptureError("the compiled region computes none of its outputs: there is nothing to plan")
    order = {node.name: index for index, node in enumerate(module.graph.nodes)}
    end_of_forward = max(computed, key=order.__getitem__)
    groups = absorb_short_lived_outputs(module.graph, assign_groups(module.graph), end_of_forward)
    groups = fuse_groups(module.graph, groups, end_of_forward)
    made = frozenset(name for name in gradients if name is not None)
    planned = build_planning_nodes(
        module,
        groups,
        group_costs(groups, flops_per_op(module, find_owners(module.graph).allocating)),
        loss=end_of_forward,
        fixed_outputs=frozenset(computed) | made,
        gradients=made,
        retain_gradients=True,
        random_state_bytes=random_state_bytes,
    )
    return Captured(
        graph=planned.graph,
        module=module,
        members=planned.members,
        exports=planned.exports,
        parameter_names=(),
        buffer_names=(),
        batch_shapes=(),
        batch_spec=None,
        loss=end_of_forward,
        gradients=tuple(gradients),
        buffer_updates=(),
        random_nodes=planned.random_nodes,
        cost_model="flops",
        device=str(device),
        region_outputs=tuple(forward_outputs),
    )
