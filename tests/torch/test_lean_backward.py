"""ReLU and max-pooling backward rewritten to read a mask and a shape (`checkmate.torch_capture.lean_backward`).

Oracles: plain `loss.backward()` bit for bit (the rewritten graph run op by op by the ATen executor, under a plan that
recomputes everything it can), the graph itself (no backward op reads a ReLU output or a pooling input), and the
allocator during a step of the Inductor executor at a budget only the rewritten graph reaches.
"""

from __future__ import annotations

import copy
from typing import Any

import numpy as np
import pytest
import torch

import checkmate
from checkmate import zoo
from checkmate.execute.program import prepare, run_schedule
from checkmate.simulate import lower
from checkmate.strategies.common import cheapest_r
from checkmate.torch_capture.channels_last import channels_last_step

aten = torch.ops.aten
POOL_BACKWARD = aten.max_pool2d_with_indices_backward.default


def _vgg(batch_size: int = 2, width: int = 4) -> tuple[torch.nn.Module, Any, tuple[torch.Tensor, ...]]:
    model, loss_fn, batch = zoo.vgg(batch_size=batch_size, image_size=32, width=width)
    for module in model.modules():
        if isinstance(module, torch.nn.Dropout):
            module.p = 0.0  # the oracle is bitwise: no random masks to line up
    return model, loss_fn, batch


def test_relu_and_pool_backward_no_longer_read_forward_tensors() -> None:
    model, loss_fn, batch = _vgg()
    captured = checkmate.capture(model, loss_fn, batch, cost_model="unit", fused=True, lean_backward=True)
    graph = captured.module.graph
    order = {node: position for position, node in enumerate(graph.nodes)}
    loss = next(node for node in graph.nodes if node.name == captured.loss)
    assert not any(node.target is aten.threshold_backward.default for node in graph.nodes)
    masks = [node for node in graph.nodes if node.target is aten.le.Scalar]
    assert masks and all(order[mask] < order[loss] for mask in masks), "every mask is made in the forward pass"
    kept = [user for mask in masks for user in mask.users]
    assert len(kept) == len(masks) and all(node.meta["val"].dtype == torch.bfloat16 for node in kept), (
        "the backward reads a 2-byte copy of each mask (Inductor's CPU code for bool tensors is slow)"
    )
    pools = [node for node in graph.nodes if node.target is POOL_BACKWARD]
    assert len(pools) == 4
    for pool in pools:
        shape = pool.args[1]
        assert shape.target is aten.expand.default and shape.args[0].target is aten.zeros.default


def test_the_rewritten_step_equals_eager_bit_for_bit() -> None:
    model, loss_fn, batch = _vgg()
    reference = copy.deepcopy(model)
    expected = loss_fn(reference, *batch)
    expected.backward()
    captured = checkmate.capture(model, loss_fn, batch, cost_model="unit", fused=True, lean_backward=True)
    nothing = np.zeros((captured.graph.size, captured.graph.size), dtype=bool)
    schedule = lower(captured.graph, cheapest_r(captured.graph, nothing), nothing)
    gradients: dict[int, torch.Tensor] = {}
    parameters = [parameter.detach() for parameter in model.parameters()]
    outputs = run_schedule(prepare(captured), schedule, [*parameters, *batch], on_gradient=gradients.__setitem__)
    assert torch.equal(outputs.loss, expected.detach())
    for index, parameter in enumerate(reference.parameters()):
        assert parameter.grad is not None and torch.equal(gradients[index], parameter.grad), index


def test_a_channels_last_pool_keeps_its_input_for_the_layout_of_its_gradient() -> None:
    """A channels-last input makes a channels-last gradient; a stand-in of no layout would make a contiguous one, which
    the nodes reading it were not compiled for."""
    model, loss_fn, batch = _vgg()
    traced = channels_last_step(loss_fn)
    captured = checkmate.capture(model, traced, batch, cost_model="unit", fused=True, lean_backward=True)
    pools = [node for node in captured.module.graph.nodes if node.target is POOL_BACKWARD]
    assert len(pools) == 4
    for pool in pools:
        assert pool.args[1].target is not aten.expand.default
        assert pool.meta["val"].is_contiguous(memory_format=torch.channels_last)


@pytest.mark.slow
def test_the_inductor_executor_rewrites_only_for_a_budget_that_needs_it() -> None:
    model, loss_fn, batch = _vgg(batch_size=8, width=16)  # activations, not kernel scratch, set its smallest budget
    options: dict[str, Any] = {
        "executor": "inductor",
        "channels_last": False,  # one layout: the leaner capture is the only next choice
        "cost_model": "flops",
        "time_limit": 5,
        "cache": False,
    }
    roomy = checkmate.compile(copy.deepcopy(model), loss_fn, batch, budget=1.0, **options)
    assert not _masks(roomy.captured), "a budget the first capture meets keeps the ATen backward ops"
    below = checkmate.minimum_budget(roomy.graph, time_limit=5).lower - 1  # proven beyond the first capture

    tight = checkmate.compile(copy.deepcopy(model), loss_fn, batch, budget=below, **options)
    assert _masks(tight.captured), "a budget below the first capture's smallest is met by the rewritten graph"
    tight(*batch)
    measured = tight.report().measured_peak
    assert measured is not None and measured <= tight.plan.peak_memory <= below


def _masks(captured: Any) -> list[Any]:
    return [node for node in captured.module.graph.nodes if node.target is aten.le.Scalar]
