"""A recomputation run inside its reader's kernel is priced below the node's first run (`checkmate.inductor.pricing`),
and runs there.

Oracles: a model built so that which planning nodes Inductor can fuse into their readers is known by construction: a
pointwise value read only by pointwise ops (the GELU of a matrix product, read by a product with its own sigmoid and
by their gradients) against values some matrix product reads; gradients of plain `loss.backward()` on a copy, and the
allocator's peak during each step. The search's use of the cheaper recomputation is tested against the exhaustive
optimum in `tests/solver/test_recompute_cost.py`.
"""

from __future__ import annotations

import copy

import pytest
import torch
from eager_oracle import compare_steps
from torch import nn

import checkmate
from checkmate.execute.codegen import SegmentCall
from checkmate.executors import executor_named
from checkmate.inductor.kernels import compile_kernels
from checkmate.inductor.measure import measure_kernels
from checkmate.inductor.memory_traffic import MemoryTraffic, memory_traffic
from checkmate.inductor.pricing import priced_graph
from checkmate.simulate import Compute
from checkmate.torch_capture import capture
from checkmate.torch_capture.fusion import is_extern

pytestmark = pytest.mark.usefixtures("module_cache_directory", "no_timing_choices")


class Swish(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.expand = nn.Linear(16, 64)
        self.project = nn.Linear(64, 4)

    def forward(self, inputs: torch.Tensor) -> torch.Tensor:
        hidden = torch.nn.functional.gelu(self.expand(inputs))
        return self.project(hidden * torch.sigmoid(hidden) + hidden)


class SwishBlock(Swish):
    """A residual block of `Swish`'s shape: its GELU output is planned apart and read by pointwise ops only."""

    def __init__(self) -> None:
        super().__init__()
        self.project = nn.Linear(64, 16)

    def forward(self, inputs: torch.Tensor) -> torch.Tensor:
        return inputs + super().forward(inputs)


def _loss(model: nn.Module, inputs: torch.Tensor) -> torch.Tensor:
    return model(inputs).square().mean()


def test_memory_traffic_interpolates_between_measured_sizes() -> None:
    traffic = MemoryTraffic((1024, 4096), (1.0, 2.0))
    assert traffic.cost(0) == 0.0
    assert traffic.cost(512) == pytest.approx(0.5)  # below the smallest size: in proportion
    assert traffic.cost(2560) == pytest.approx(1.5)
    assert traffic.cost(8192) == pytest.approx(4.0)  # beyond the largest: in proportion


def test_the_device_traffic_is_measured_once_and_grows_with_size() -> None:
    traffic = memory_traffic(torch.device("cpu"))
    assert all(seconds > 0 for seconds in traffic.seconds)
    assert traffic.cost(traffic.sizes[-1]) > traffic.cost(traffic.sizes[0])
    assert memory_traffic(torch.device("cpu")) == traffic  # from the cache


def test_only_a_node_fused_with_all_its_readers_recomputes_for_less() -> None:
    torch.manual_seed(0)
    model, batch = Swish(), (torch.randn(256, 16),)
    captured = capture(model, _loss, batch, cost_model="flops", fused=True)
    kernels = compile_kernels(captured)
    inputs = [*(parameter.detach() for parameter in model.parameters()), *batch]
    measures = measure_kernels(captured, kernels, inputs, torch.device("cpu"))
    traffic = MemoryTraffic((1,), (1e-9,))  # a nanosecond a byte
    graph = priced_graph(captured, kernels, measures, traffic=traffic)
    fx_nodes = {node.name: node for node in captured.module.graph.nodes}
    extern = [any(is_extern(fx_nodes[name]) for name in members) for members in captured.members]
    cheaper = [index for index, node in enumerate(graph.nodes) if node.recompute_cost is not None]
    assert cheaper, "the GELU's output is read by pointwise ops only"
    for index in cheaper:
        node = graph.nodes[index]
        assert not extern[index] and not any(extern[user] for user in graph.users[index])
        assert node.recompute_cost == pytest.approx(max(0.0, node.cost - 1e-9 * node.memory))
    gelu = next(index for index, members in enumerate(captured.members) if any("gelu" in name for name in members))
    assert gelu in cheaper or any(gelu in graph.users[index] for index in cheaper)
    matmuls = [index for index in range(graph.size) if extern[index]]
    assert matmuls and all(graph.nodes[index].recompute_cost is None for index in matmuls)
    unpriced = priced_graph(captured, kernels, measures, traffic=None)
    assert all(node.recompute_cost is None for node in unpriced.nodes), "FLOP costs have no time to save"


def test_the_executor_prices_recomputations_with_the_device_traffic() -> None:
    torch.manual_seed(0)
    model, batch = Swish(), (torch.randn(256, 16),)
    captured = capture(model, _loss, batch, cost_model="flops", fused=True)
    priced, _ = executor_named("inductor").prepare(captured, model, batch, "profile")
    assert any(node.recompute_cost is not None for node in priced.graph.nodes)
    flops, _ = executor_named("inductor").prepare(captured, model, batch, "flops")
    assert all(node.recompute_cost is None for node in flops.graph.nodes)


@pytest.mark.slow
def test_a_recomputation_priced_as_fused_runs_inside_its_readers_call() -> None:
    """Where the plan recomputes a node priced as fused into its readers, the step runs that recomputation in the
    same compiled call as a reader at the same stage (unless the run was split to fit the plan's peak: then on its
    own); gradients are eager's and the allocator stays within the plan."""
    torch.manual_seed(0)
    model, batch = nn.Sequential(*(SwishBlock() for _ in range(3))), (torch.randn(2048, 16),)
    reference = copy.deepcopy(model)
    step = checkmate.compile(model, _loss, batch, budget=0.8, executor="inductor", measure_memory="never")
    graph, plan = step.graph, step.plan
    cheaper = {
        (stage, node)
        for stage in range(graph.size)
        for node in range(stage)
        if plan.R[stage, node] and graph.nodes[node].recompute_cost is not None
    }
    assert cheaper, "the tight budget is met by recomputing the GELU outputs and their sigmoids"
    compiled = step._compiled[step._current]
    fused = set()
    for item in compiled.program.run_steps(compiled.schedule):
        if isinstance(item, SegmentCall):
            computed = {(compute.stage, compute.node) for compute in item.computes}
            fused |= {
                (stage, node)
                for stage, node in computed & cheaper
                if any((stage, user) in computed for user in graph.users[node])
            }
    assert fused, f"no recomputation priced as fused runs with a reader: {sorted(cheaper)}"
    # a run split to fit the plan's peak may leave some apart from their readers, in a call of their own or in a part
    # of the split run: those are predicted at that call's cost
    apart = cheaper - fused
    steps = compiled.program.run_steps(compiled.schedule)
    placed = {(item.stage, item.node) for item in steps if isinstance(item, Compute)}
    placed |= {
        (compute.stage, compute.node) for item in steps if isinstance(item, SegmentCall) for compute in item.computes
    }
    assert placed >= apart
    compare_steps(step, reference, batch, seed=11, context="a recomputation fused into its reader", exact=False)
