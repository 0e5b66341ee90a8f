"""The model zoo: every factory's tiny variant trains and captures with the structure its architecture has, and the
full-size models capture on fake tensors (`benchmarks/max_batch.py` captures the others at full size)."""

from __future__ import annotations

import inspect
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable
from typing import Any

import pytest
import torch

import checkmate
from checkmate import Captured, Graph, zoo
from checkmate.torch_capture.fake_factory import fake_graph_at

# name -> (tiny variant, forward convolutions (transposed ones included), attention ops, max-unpools)
TINY: dict[str, tuple[Callable[[], zoo.Factory], int, int, int]] = {
    "vgg16": (lambda: zoo.vgg16(batch_size=2, image_size=32, width=1 / 16), 13, 0, 0),
    "vgg19": (lambda: zoo.vgg19(batch_size=2, image_size=32, width=1 / 16), 16, 0, 0),
    "mobilenet": (lambda: zoo.mobilenet(batch_size=2, image_size=32, width=1 / 8), 27, 0, 0),
    "resnet50": (lambda: zoo.resnet50(batch_size=2, image_size=32, width=1 / 16), 53, 0, 0),
    "unet": (lambda: zoo.unet(batch_size=2, image_size=(32, 48), width=1 / 16), 23, 0, 0),
    "fcn8": (lambda: zoo.fcn8(batch_size=2, image_size=(32, 64), width=1 / 16), 21, 0, 0),
    "segnet": (lambda: zoo.segnet(batch_size=2, image_size=(32, 64), width=1 / 16), 26, 0, 5),
    "gpt2": (lambda: zoo.gpt2(batch_size=2, length=16, dim=32, heads=2, layers=2, vocab=64), 0, 2, 0),
    "convnext": (lambda: zoo.convnext(batch_size=2, image_size=32, widths=(8, 16), depths=(1, 1)), 4, 0, 0),
}
LONG_SKIPS = {"unet", "fcn8", "segnet"}
CHAINS = {"vgg16", "vgg19"}


def forward_spans(graph: Graph) -> list[int]:
    """For each edge between two forward nodes, how many nodes it skips over (1: from the node just before)."""
    return [
        target - source
        for target, node in enumerate(graph.nodes)
        if not node.backward
        for source in node.inputs
        if not graph.nodes[source].backward
    ]


def op_counts(captured: Captured) -> Counter[str]:
    return Counter(str(node.target) for node in captured.module.graph.nodes if node.op == "call_function")


def test_every_factory_is_registered_and_takes_batch_size_first() -> None:
    assert set(TINY) | {"mlp", "vgg", "resnet", "gpt"} == set(zoo.FACTORIES)
    for name, factory in zoo.FACTORIES.items():
        assert next(iter(inspect.signature(factory).parameters)) == "batch_size", name
        assert getattr(zoo, name) is factory


def test_the_paper_models_default_to_the_paper_settings() -> None:
    def default(factory: Callable[..., Any], argument: str) -> Any:
        return inspect.signature(factory).parameters[argument].default

    for factory in (zoo.vgg16, zoo.vgg19, zoo.mobilenet, zoo.resnet50):
        assert default(factory, "image_size") == 224 and default(factory, "classes") == 1000
    for factory in (zoo.unet, zoo.fcn8, zoo.segnet):
        assert default(factory, "image_size") == (416, 608)
    gpt2 = {argument: default(zoo.gpt2, argument) for argument in ("layers", "dim", "heads", "length", "vocab")}
    assert gpt2 == {"layers": 12, "dim": 768, "heads": 12, "length": 1024, "vocab": 50257}


@pytest.mark.parametrize("name", sorted(TINY))
def test_tiny_variant_trains_and_captures_with_its_structure(name: str) -> None:
    factory, convolutions, attentions, unpools = TINY[name]
    model, loss_fn, batch = factory()
    again = factory()
    assert all(torch.equal(x, y) for x, y in zip(batch, again[2], strict=True)), "the batch is seeded"
    assert all(torch.equal(x, y) for x, y in zip(model.parameters(), again[0].parameters(), strict=True))
    loss = loss_fn(model, *batch)
    assert loss.ndim == 0 and torch.isfinite(loss)
    loss.backward()
    started = time.perf_counter()
    captured = checkmate.capture(model, loss_fn, batch, cost_model="flops")
    assert time.perf_counter() - started < 30
    graph = captured.graph
    counts = op_counts(captured)
    assert counts["aten.convolution.default"] == convolutions
    assert sum(n for op, n in counts.items() if "scaled_dot_product" in op and "backward" not in op) == attentions
    assert counts["aten.max_unpool2d.default"] == unpools
    forward = int((~graph.is_backward).sum())
    layers = max(convolutions, 6 * attentions)
    assert layers <= forward <= 8 * layers and forward < graph.size <= 3 * forward
    spans = forward_spans(graph)
    if name in CHAINS:
        assert max(spans) == 1, "VGG is a chain"
    if name in LONG_SKIPS:
        assert max(spans) > forward / 2, "a long skip from the encoder to the end of the decoder"
    if name == "resnet50":
        joins = sum(len({i for i in node.inputs if not graph.nodes[i].backward}) >= 2 for node in graph.nodes)
        assert joins >= 16, "each of the 16 bottleneck blocks adds its shortcut"
        assert max(spans) < forward / 10, "no skip longer than a block"


def test_fake_capture_gives_the_graph_of_the_real_model() -> None:
    model, loss_fn, batch = zoo.resnet(batch_size=3, image_size=8, width=4, blocks=(1, 1))
    real = checkmate.capture(model, loss_fn, batch, cost_model="flops").graph
    fake = fake_graph_at(zoo.resnet, cost_model="flops", image_size=8, width=4, blocks=(1, 1))(3)
    assert fake.to_json() == real.to_json()


def test_fake_capture_refuses_the_profile_cost_model() -> None:
    with pytest.raises(checkmate.CaptureError, match="fake tensors"):
        fake_graph_at(zoo.mlp, cost_model="profile")


@pytest.mark.slow
def test_full_size_vgg19_at_batch_1024_captures_without_allocating() -> None:
    code = (
        "import resource, time; from checkmate import solve, zoo\n"
        "from checkmate.torch_capture.fake_factory import fake_graph_at\n"
        "import torch\n"
        "before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss\n"
        "started = time.perf_counter(); graph = fake_graph_at(zoo.vgg19)(1024)\n"
        "elapsed = time.perf_counter() - started\n"
        "grown = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before\n"
        "print(elapsed, grown * 1024, solve(graph, None).peak_memory, graph.fixed_memory)\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=300)
    elapsed, grown, peak, fixed = (float(value) for value in result.stdout.split())
    assert peak > 64 * 2**30, "the step needs more than 64 GiB of activations"
    assert fixed > 2**30, "VGG19's weights and gradients alone take more than 1 GiB"
    assert grown < 2**30 and elapsed < 60, f"grew {grown / 2**20:.0f} MiB in {elapsed:.1f} s"
