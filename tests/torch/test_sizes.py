"""What a value takes in memory: its storage's bytes, in whole 512-byte blocks on CUDA's caching allocator, and as
large as the storage the real kernel makes.

The CUDA cases use fake tensors, which need no device: `torch.cuda.max_memory_allocated` counts blocks, so a plan that
counted a 4-byte loss as 4 bytes read 508 bytes under the measured peak on an H200 (tests/torch/test_cuda.py). The CPU
cases run the captured graph for real and compare each new storage with the table's bytes for it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch
from test_guards import batch, mse, tiny_model
from torch import nn
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.fx.experimental.proxy_tensor import make_fx
from torch.nn import functional
from torch.utils import _pytree as pytree

import checkmate
from checkmate.torch_capture.sizes import allocated_bytes, storage_table

pytestmark = pytest.mark.usefixtures("module_cache_directory")


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


REDUCED_LOSSES: dict[str, Callable[..., torch.Tensor]] = {
    "mse_loss": functional.mse_loss,
    "smooth_l1_loss": functional.smooth_l1_loss,
    "binary_cross_entropy": lambda inputs, target, reduction: functional.binary_cross_entropy(
        inputs.sigmoid(), target.sigmoid(), reduction=reduction
    ),
    "soft_margin_loss": functional.soft_margin_loss,
}


@pytest.mark.parametrize("reduction", ["mean", "sum"])
@pytest.mark.parametrize("name", REDUCED_LOSSES)
def test_a_reduced_loss_takes_the_storage_the_kernel_makes(name: str, reduction: str) -> None:
    """The kernel writes the elementwise losses into its output and resizes it to the scalar, keeping the storage:
    on CPU a scalar loss of 32x4 values holds 512 bytes, which its fake tensor (4 bytes) does not show."""

    def loss(inputs: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        return REDUCED_LOSSES[name](inputs, target, reduction=reduction)

    example = (torch.randn(32, 4), torch.randn(32, 4))
    graph = make_fx(loss, tracing_mode="fake")(*example).graph
    table = storage_table(graph)
    returned = next(node for node in graph.nodes if node.op == "output").args[0]
    real = loss(*example).untyped_storage().nbytes()
    assert real == 32 * 4 * 4, "the premise: the kernel keeps its elementwise buffer"
    assert sum(table.storages(returned.name).values()) == real


class _StorageRecorder(torch.fx.Interpreter):
    """Runs a captured step's fx graph on real tensors and records each node's output storages."""

    def __init__(self, module: torch.fx.GraphModule) -> None:
        super().__init__(module)
        self.storages: dict[str, list[torch.UntypedStorage | None]] = {}

    def run_node(self, n: torch.fx.Node) -> Any:
        value = super().run_node(n)
        outputs = list(value) if isinstance(value, (tuple, list)) else [value]
        self.storages[n.name] = [
            output.untyped_storage() if isinstance(output, torch.Tensor) else None for output in outputs
        ]
        return value


def _assert_storages_as_planned(
    model: nn.Module, loss_fn: Callable[..., torch.Tensor], example: tuple[Any, ...]
) -> None:
    """Every storage the captured graph makes when it runs takes the bytes the storage table gives it, and a value
    the table puts in its source's storage is in it (an alias, such as the identity of dropout in eval())."""
    step = checkmate.compile(
        model, loss_fn, example, budget=1.0, method="checkpoint_all", cost_model="flops", measure_memory="never"
    )
    captured = step.captured
    parameters = dict(model.named_parameters())
    buffers = dict(model.named_buffers())
    inputs = [parameters[name].detach() for name in captured.parameter_names]
    inputs += [buffers[name] for name in captured.buffer_names]
    inputs += pytree.tree_leaves(list(example))
    recorder = _StorageRecorder(captured.module)
    recorder.run(*inputs)
    table = storage_table(captured.module.graph)
    real: dict[int, torch.UntypedStorage] = {}
    for name, storages in recorder.storages.items():
        for key, storage in zip(table.slots.get(name, ()), storages, strict=False):
            if key is None or storage is None:
                continue
            if key in real:
                assert storage.data_ptr() == real[key].data_ptr() or storage.nbytes() == 0, f"{name} is no alias"
                continue
            real[key] = storage
            assert table.sizes[key] == storage.nbytes(), f"{name}: table {table.sizes[key]}, real {storage.nbytes()}"


@pytest.mark.parametrize("mode", ["eval", "train"])
def test_the_steps_storages_are_the_ones_the_table_counts(mode: str) -> None:
    model = tiny_model()
    getattr(model, mode)()
    _assert_storages_as_planned(model, mse, batch())


@pytest.mark.parametrize("mode", ["eval", "train"])
def test_the_measured_peak_is_within_the_plan(mode: str) -> None:
    """Linear, BatchNorm, ReLU, Dropout, Linear and an MSE loss; the second call adds into the first call's `.grad`s,
    so every gradient is live for the whole step as the plan assumes. The step's meter must read within the plan."""
    model = tiny_model()
    getattr(model, mode)()
    step = checkmate.compile(
        model, mse, batch(), budget="1MiB", cost_model="flops", method="checkpoint_all", measure_memory="every"
    )
    for seed in (3, 4):
        torch.manual_seed(seed)
        step(*batch())
        measured = step.report().measured_peak
        assert measured is not None and measured <= step.plan.peak_memory, (
            f"call {seed} in {mode}(): measured {measured} bytes, planned {step.plan.peak_memory}"
        )


def test_a_hugging_face_regression_head_in_eval_is_counted_as_it_runs() -> None:
    """BERT with one label regresses with `MSELoss` (transformers picks it), in eval() as `from_pretrained` returns
    it: every storage of the step as the table counts it, and the step's meter within the plan."""
    transformers = pytest.importorskip("transformers")
    config = transformers.BertConfig(
        vocab_size=64,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=64,
        max_position_embeddings=32,
        num_labels=1,
    )
    torch.manual_seed(0)
    model = transformers.BertForSequenceClassification(config).eval()
    generator = torch.Generator().manual_seed(1)
    example = (torch.randint(2, 64, (8, 16), generator=generator), torch.randn(8, generator=generator))

    def loss_fn(model: nn.Module, tokens: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        return model(input_ids=tokens, labels=labels).loss

    _assert_storages_as_planned(model, loss_fn, example)
    step = checkmate.compile(
        model, loss_fn, example, budget=1.0, cost_model="flops", method="checkpoint_all", measure_memory="every"
    )
    for seed in (3, 4):
        torch.manual_seed(seed)
        step(*example)
        measured = step.report().measured_peak
        assert measured is not None and measured <= step.plan.peak_memory
