"""The hand-off between capture and execution: a planning Graph tied to the joint fx graph it was made from.

Contract (capture produces it, the executor relies on it):

* `module` is a functional torch.fx.GraphModule of one whole training step at the ATen level. Its
  placeholders are, in order, the parameters (`parameter_names`), the buffers (`buffer_names`) and the
  flattened batch tensors (`batch_shapes`). It contains no in-place mutation of a placeholder: buffer
  updates (BatchNorm running statistics) are ordinary values that `buffer_updates` names.
* Graph node i stands for the fx nodes `members[i]`, in fx order. Computing node i means evaluating
  those fx nodes; their arguments are placeholders, fx values of the same member list, or fx values
  listed in `exports[j]` of an earlier graph node j that the plan keeps live (j is in graph.nodes[i].inputs).
* `exports[i]` are the fx values of node i that other graph nodes read. Node i's memory is their bytes
  (storage counted once, views free). A value of node i that is not exported dies after its last reader
  among node i's members; graph.nodes[i].workspace is how far such values raise node i's live bytes above
  its memory while it runs.
* `loss`, `gradients`, `input_gradients`, `buffer_updates` and `region_outputs` name fx values that leave the
  step. They are taken when their graph node is computed for the first time (stage i of node i). They are counted
  in graph.fixed_memory, never as node memory. A gradient is also in its node's
  workspace (a step that accumulates holds it beside the existing `.grad` until added); captured with
  `gradient_memory="when_made"`, gradients are instead retained by the node that makes them
  (graph.nodes[i].retained, from its first run to the end of the step). When a node is
  recomputed, exported buffer updates, outputs and loss are replaced by the first run's tensors, so that its live
  copy holds nothing the fixed memory does not already count.
* `random_nodes` are the graph nodes whose members draw random numbers: a recomputation must replay
  the random stream of the first computation, so each retains the generator state saved for it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import cached_property
from typing import TYPE_CHECKING, Any, Protocol

from checkmate.graph import Graph
from checkmate.options import CostModel

if TYPE_CHECKING:
    import torch
    import torch.fx


class RebuildsResult(Protocol):
    """How loss_fn's result is rebuilt from the step's loss and its other outputs
    (`checkmate.torch_capture.loss_output.LossOutput`)."""

    def rebuild(self, loss: torch.Tensor, outputs: Sequence[torch.Tensor]) -> Any: ...


@dataclass(frozen=True)
class Captured:
    """A captured training step.

    Attributes:
        graph: the planning graph (costs, sizes, dependencies).
        module: the joint forward + backward fx graph.
        members: for each graph node, the names of the fx nodes it evaluates, in execution order.
        exports: for each graph node, the names of its fx values read by other graph nodes.
        parameter_names: the model's parameters in placeholder order, each tensor once under the first name
            `named_parameters()` gives it (a tied tensor is one placeholder and gets one, summed, gradient).
        buffer_names: the model's buffers likewise, in placeholder order (after the parameters).
        batch_shapes: (shape, dtype name) of each flattened batch tensor, in placeholder order.
        batch_spec: the pytree spec of the batch, to flatten a new batch the same way.
        loss: fx name of the scalar loss.
        gradients: for each parameter, the fx name of its gradient, or None when it gets none (frozen, or not
            reached from the loss: its `.grad` is left alone, as eager leaves it).
        buffer_updates: for each buffer, the fx name of its new value, or None when the step leaves it alone.
        random_nodes: graph nodes that draw random numbers.
        cost_model: the cost model that priced the nodes ("profile", "flops" or "unit").
        device: the device the costs were measured for, such as "cpu" or "cuda:0".
        region_outputs: forward outputs other than the loss that leave the step, held in the fixed memory like the
            loss: for a region compiled by `torch.compile` (`checkmate.inductor.backend`), all its forward outputs;
            for a captured step, the other tensors loss_fn returns (`loss_output` puts them in place).
        attribute_reads: the module attributes the traced code read, each as (the module's qualified name, or the
            module itself when it is not the model's, attribute name): what `checkmate.training.guards` guards.
        input_gradients: for each batch tensor, the fx name of its gradient, or None when it requires none (added
            into its `.grad` as eager's backward does).
        loss_output: how loss_fn's result is rebuilt from the loss and `region_outputs` (None: the loss itself).
    """

    graph: Graph
    module: torch.fx.GraphModule
    members: tuple[tuple[str, ...], ...]
    exports: tuple[tuple[str, ...], ...]
    parameter_names: tuple[str, ...]
    buffer_names: tuple[str, ...]
    batch_shapes: tuple[tuple[tuple[int, ...], str], ...]
    batch_spec: Any
    loss: str
    gradients: tuple[str | None, ...]
    buffer_updates: tuple[str | None, ...]
    random_nodes: frozenset[int]
    cost_model: CostModel
    device: str
    region_outputs: tuple[str, ...] = ()
    attribute_reads: tuple[tuple[Any, str], ...] = ()
    input_gradients: tuple[str | None, ...] = ()
    loss_output: RebuildsResult | None = None

    @cached_property
    def node_of(self) -> dict[str, int]:
        """The graph node of each fx node that some graph node evaluates (`members`)."""
        return {name: index for index, members in enumerate(self.members) for name in members}


def last_uses(computed: Sequence[str], fx_nodes: Mapping[str, torch.fx.Node]) -> dict[str, int]:
    """For a node's computed members in order: the position of the last member reading each one (its own position
    when no member reads it). A value that is not exported dies right after that member: the executor drops it
    there, and capture counts it in the node's workspace until then."""
    position_of = {name: position for position, name in enumerate(computed)}
    last = dict(position_of)
    for position, name in enumerate(computed):
        for argument in fx_nodes[name].all_input_nodes:
            if argument.name in position_of:
                last[argument.name] = max(last[argument.name], position)
    return last
