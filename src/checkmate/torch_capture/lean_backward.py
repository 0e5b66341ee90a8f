"""Backward ops rewritten to read what Inductor's generated code reads, so a plan may keep less for them.

Two ATen backward ops take a whole forward tensor that their compiled form does not need in full:

* `threshold_backward(grad, y, threshold)` (a ReLU's backward) reads `y` only to compare it with the threshold.
  It becomes `where(mask != 0, 0, grad)` with `mask = le(y, threshold)` computed in the forward pass, right after
  `y`, and stored as bfloat16: the plan may then keep the 2-byte mask instead of the 4-byte `y`. The values are the
  same bit for bit: both give `grad` where `y > threshold` and 0 elsewhere (NaN included). Not a 1-byte bool mask,
  as `torch.compile`'s partitioner saves: Inductor's CPU code for 1-byte tensors is slow here (making and reading a
  bool mask take many times what a bfloat16 one takes: `benchmarks/investigations/mask_dtypes.py`).
* `max_pool2d_with_indices_backward(grad, x, ..., indices)` reads `x` for its shape only (Inductor's lowering scatters
  `grad` by `indices` into a buffer of `x`'s size; the ATen kernel likewise writes zeros of `x`'s shape). `x` is
  replaced by a zero tensor expanded to its shape, which holds no memory, so the pooling's input need not be kept.
  Not where the input is channels-last: its layout also picks the gradient's, and the stand-in has none.

Applied by `capture(..., lean_backward=True)`, which the Inductor executor plans only when its other captures cannot
meet the budget or must recompute to meet it, and runs only when its plan is cheaper
(`checkmate.executors.inductor.InductorExecutor.capture_choices`): making the masks costs a pass over each
ReLU's output.
"""

from __future__ import annotations

import logging
from typing import Any

import torch
import torch.fx
from torch.fx.node import map_arg

log = logging.getLogger(__name__)

aten = torch.ops.aten

MASK_DTYPE = torch.bfloat16  # exact for 0 and 1, and fast in Inductor's CPU code (module docstring)


def lean_backward(module: torch.fx.GraphModule) -> None:
    """Rewrite the joint graph's ReLU and max-pooling backward ops (in place; module docstring)."""
    graph = module.graph
    masks = stand_ins = 0
    for node in list(graph.nodes):
        if node.target is aten.threshold_backward.default:
            _mask_relu_backward(graph, node)
            masks += 1
        elif node.target is aten.max_pool2d_with_indices_backward.default:
            stand_ins += _pool_backward_by_shape(graph, node)
    if masks or stand_ins:
        graph.lint()
        module.recompile()
        log.info("lean backward: %d ReLU backward ops read a mask, %d max-pool backward ops a shape", masks, stand_ins)


def _mask_relu_backward(graph: torch.fx.Graph, node: torch.fx.Node) -> None:
    grad, output, threshold = node.args
    assert isinstance(output, torch.fx.Node)
    while output.target in (aten.detach.default, aten.alias.default):  # to the op that made y, in the forward
        output = output.args[0]
        assert isinstance(output, torch.fx.Node)
    fake_mode = output.meta["val"].fake_mode
    with graph.inserting_after(output):
        compared = _call(graph, aten.le.Scalar, (output, threshold), fake_mode)
    with graph.inserting_after(compared):
        mask = _call(graph, aten._to_copy.default, (compared,), fake_mode, {"dtype": MASK_DTYPE})
    with graph.inserting_before(node):
        condition = _call(graph, aten.ne.Scalar, (mask, 0), fake_mode)
        masked = _call(graph, aten.where.ScalarSelf, (condition, 0.0, grad), fake_mode)
    node.replace_all_uses_with(masked)
    graph.erase_node(node)


def _pool_backward_by_shape(graph: torch.fx.Graph, node: torch.fx.Node) -> bool:
    """Replace the input; False (graph unchanged) where the result's layout would change: the input's layout picks
    the result's (a channels-last input gives a channels-last gradient), and a stand-in has no layout."""
    source = node.args[1]
    assert isinstance(source, torch.fx.Node)
    value = source.meta["val"]
    with graph.inserting_before(node):
        options = {"dtype": value.dtype, "device": value.device}
        zero = _call(graph, aten.zeros.default, ([],), value.fake_mode, options)
        shaped = _call(graph, aten.expand.default, (zero, list(value.shape)), value.fake_mode)
    node.replace_input_with(source, shaped)
    traced = node.meta["val"]
    if _fake_value(node.target, node.args, node.kwargs, value.fake_mode).stride() == traced.stride():
        return True
    node.replace_input_with(shaped, source)
    graph.erase_node(shaped)
    graph.erase_node(zero)
    return False


def _call(
    graph: torch.fx.Graph, target: Any, args: tuple[Any, ...], fake_mode: Any, kwargs: dict[str, Any] | None = None
) -> torch.fx.Node:
    """A new call node with its fake value in `meta["val"]`, as the trace gives every node."""
    created = graph.call_function(target, args, kwargs or {})
    created.meta["val"] = _fake_value(target, args, kwargs or {}, fake_mode)
    return created


def _fake_value(target: Any, args: Any, kwargs: Any, fake_mode: Any) -> Any:
    values = map_arg((args, kwargs), lambda argument: argument.meta["val"])
    with fake_mode:
        return target(*values[0], **values[1])
