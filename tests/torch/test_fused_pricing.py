"""A recomputation run inside its reader's kernel is priced below the node's first run (`checkmate.inductor.pricing`).

Oracle: a model built so that which planning nodes Inductor can fuse into their readers is known by construction: a
pointwise value read only by pointwise ops (the GELU of a matrix product, read by a product with its own sigmoid and
by their gradients) against values some matrix product reads.
"""

from __future__ import annotations

import pytest
import torch
from torch import nn

from checkmate.executors import executor_named
from checkmate.inductor.kernels import compile_kernels
from checkmate.inductor.measure import measure_kernels
from checkmate.inductor.memory_traffic import MemoryTraffic, memory_traffic
from checkmate.inductor.pricing import priced_graph
from checkmate.torch_capture import capture
from checkmate.torch_capture.fusion import is_extern

pytestmark = pytest.mark.usefixtures("module_cache_directory")


class Swish(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.expand = nn.Linear(16, 64)
        self.project = nn.Linear(64, 4)

    def forward(self, inputs: torch.Tensor) -> torch.Tensor:
        hidden = torch.nn.functional.gelu(self.expand(inputs))
        return self.project(hidden * torch.sigmoid(hidden) + hidden)


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
