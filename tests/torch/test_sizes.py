"""What a value takes in memory: its storage's bytes, in whole 512-byte blocks on CUDA's caching allocator.

The CUDA cases use fake tensors, which need no device: `torch.cuda.max_memory_allocated` counts blocks, so a plan that
counted a 4-byte loss as 4 bytes read 508 bytes under the measured peak on an H200 (tests/torch/test_cuda.py).
"""

from __future__ import annotations

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.fx.experimental.proxy_tensor import make_fx

from checkmate.torch_capture.sizes import allocated_bytes, storage_table


@pytest.mark.parametrize(
    ("elements", "cpu_bytes", "cuda_bytes"), [(0, 0, 0), (1, 4, 512), (128, 512, 512), (129, 516, 1024)]
)
def test_cuda_storages_take_whole_blocks(elements: int, cpu_bytes: int, cuda_bytes: int) -> None:
    with FakeTensorMode():
        on_cpu = torch.empty(elements)
        on_cuda = torch.empty(elements, device="cuda")
    assert allocated_bytes(on_cpu) == cpu_bytes
    assert allocated_bytes(on_cuda) == cuda_bytes


def test_the_storage_table_counts_blocks_on_cuda() -> None:
    """A view shares its source's storage; a scalar loss on CUDA takes one block."""

    def loss(inputs: torch.Tensor) -> torch.Tensor:
        return (inputs.t() * 2).sum()

    with FakeTensorMode():
        inputs = torch.empty(3, 5, device="cuda")
        graph = make_fx(loss, tracing_mode="fake")(inputs).graph
    table = storage_table(graph)
    sizes = {node.name: sum(table.storages(node.name).values()) for node in graph.nodes if node.op != "output"}
    assert sizes == {"inputs_1": 512, "t": 512, "mul": 512, "sum_1": 512}
    assert len(table.sizes) == 3, "t is a view of the input"
