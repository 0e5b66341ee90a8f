"""Per-op compute costs for the planning graph: "unit", "flops" or "profile".

* "unit": every planning node costs 1 (merged nodes cost the number of nodes merged into them).
* "flops": PyTorch's own FLOP formulas (`torch.utils.flop_counter.flop_registry`), evaluated on the
  fake tensors' shapes. Ops PyTorch gives no formula (elementwise ops, reductions, copies) are charged
  one operation per output element, so recomputing them is never free. Views cost 0.
* "profile": measured time in seconds on the model's device; see `checkmate.torch_capture.profile`.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

import torch
from torch.utils import _pytree as pytree
from torch.utils.flop_counter import flop_registry

from checkmate.errors import CaptureError
from checkmate.options import CostModel, choices
from checkmate.torch_capture.sizes import tensors_of

log = logging.getLogger(__name__)

COST_MODELS = choices(CostModel)

# Ops PyTorch's counter has no entry for, mapped to an op whose formula reads the same leading arguments.
_SAME_FORMULA: dict[Any, Any] = {
    torch.ops.aten._scaled_dot_product_flash_attention_for_cpu: torch.ops.aten._scaled_dot_product_flash_attention,
    torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward: (
        torch.ops.aten._scaled_dot_product_flash_attention_backward
    ),
}


def check_cost_model(cost_model: str) -> None:
    """Raise CaptureError unless `cost_model` is a `CostModel`."""
    if cost_model not in COST_MODELS:
        raise CaptureError(f"unknown cost_model {cost_model!r}: choose one of {', '.join(COST_MODELS)}")


def fx_values(node: torch.fx.Node) -> tuple[tuple[object, ...], dict[str, object]]:
    """The node's arguments with every fx node replaced by its recorded (fake) value."""
    return pytree.tree_map_only(torch.fx.Node, lambda argument: argument.meta.get("val"), (node.args, node.kwargs))


def op_flops(node: torch.fx.Node, allocating: frozenset[str]) -> float:
    """FLOPs of one fx node: PyTorch's formula where one exists, else one per output element; 0 for views."""
    if node.name not in allocating:
        return 0.0
    value = node.meta.get("val")
    elements = float(sum(tensor.numel() for tensor in tensors_of(value)))
    target = node.target
    packet: Any = target.overloadpacket if isinstance(target, torch._ops.OpOverload) else None
    formula = flop_registry.get(_SAME_FORMULA.get(packet, packet))
    if formula is None:
        return elements
    args, kwargs = fx_values(node)
    return max(float(formula(*args, **kwargs, out_val=value)), elements)


def unit_per_op(groups: Sequence[Sequence[str]]) -> dict[str, float]:
    """The unit model as per-op costs: 1 for the first op of each planning node, 0 for the others."""
    return {name: float(position == 0) for names in groups for position, name in enumerate(names)}


def group_costs(groups: Sequence[Sequence[str]], per_op: dict[str, float]) -> list[float]:
    """Sum per-op costs over each planning node."""
    missing = [name for names in groups for name in names if name not in per_op]
    if missing:
        raise CaptureError(f"internal: no cost for fx node {missing[0]!r}")
    return [sum(per_op[name] for name in names) for names in groups]


def flops_per_op(module: torch.fx.GraphModule, allocating: frozenset[str]) -> dict[str, float]:
    """FLOPs of each call node of the joint graph."""
    return {node.name: op_flops(node, allocating) for node in module.graph.nodes if node.op == "call_function"}
