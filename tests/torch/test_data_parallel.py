"""checkmate.compile of a DistributedDataParallel module against eager DDP, with 2 CPU processes on gloo.

The oracle on each rank is eager DDP: `loss_fn(ddp_reference, *batch).backward()` on a copy of the model wrapped
in its own DistributedDataParallel, fed the same per-rank batch. After every step the loss, every `.grad`
(presence, values bit for bit, layout) and every buffer must equal the oracle's, and the peak the CPU allocator held
during the step must be within the plan's (which holds the gradient buckets in its fixed memory).
"""

from __future__ import annotations

import copy
import datetime
import random
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from eager_oracle import measured_call
from gloo_ranks import WORLD_SIZE, gloo_ranks
from torch import nn
from torch.nn.parallel import DistributedDataParallel

import checkmate
from checkmate import zoo
from checkmate.data_parallel import DataParallel, assign_buckets
from checkmate.errors import CaptureError, DataParallelError, RankFailed
from checkmate.training.compiled import CompiledStep

TIMEOUT = datetime.timedelta(seconds=120)


class UnusedHead(nn.Module):
    """An MLP with BatchNorm and a head the loss never reads."""

    def __init__(self) -> None:
        super().__init__()
        self.body = nn.Sequential(nn.Linear(8, 16), nn.BatchNorm1d(16), nn.ReLU(), nn.Linear(16, 4))
        self.unused = nn.Linear(4, 4)

    def forward(self, inputs: torch.Tensor) -> torch.Tensor:
        return self.body(inputs)


def _assert_same(
    step: CompiledStep, reference: nn.Module, loss: torch.Tensor, measured: int, expected: torch.Tensor
) -> None:
    context = f"rank {dist.get_rank()}"
    assert torch.equal(loss, expected.detach()), f"{context}: loss {loss.item()} != {expected.item()}"
    for (name, got), want in zip(step.module.named_parameters(), reference.parameters(), strict=True):
        assert (got.grad is None) == (want.grad is None), f"{context}: {name}.grad presence differs"
        if want.grad is not None:
            assert torch.equal(got.grad, want.grad), f"{context}: {name}.grad differs from eager DDP's"
            assert got.grad.stride() == want.grad.stride(), f"{context}: {name}.grad has another layout"
    for (name, got), want in zip(step.module.named_buffers(), reference.buffers(), strict=True):
        assert torch.equal(got, want), f"{context}: buffer {name} differs from eager DDP's"
    planned = step.plan.peak_memory
    assert measured <= planned, f"{context}: the allocator held {measured} bytes, above the plan's {planned}"


def _train(step: CompiledStep, reference: DistributedDataParallel, make_batch: Callable[[int], Any]) -> None:
    """Five steps against eager DDP: from no `.grad`; after an SGD update and zero_grad; accumulating into the
    reduced `.grad`; accumulating locally under no_sync(); and the synchronised step after it."""
    optimizers = [torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9) for model in (step.model, reference)]

    def one_step(number: int) -> None:
        batch = make_batch(number)
        loss, measured = measured_call(step, batch)
        expected = step.loss_fn(reference, *batch)
        expected.backward()
        _assert_same(step, reference.module, loss, measured, expected)

    one_step(1)
    for optimizer in optimizers:
        optimizer.step()
        optimizer.zero_grad()
    one_step(2)
    one_step(3)
    assert isinstance(step.distribution, DataParallel)
    with step.distribution.ddp.no_sync(), reference.no_sync():
        one_step(4)
    one_step(5)


def _resnet_on_ranks() -> tuple[DistributedDataParallel, Any, DistributedDataParallel, Callable[[int], Any]]:
    """A small ResNet in DDP with small buckets, its eager DDP copy, and each step's batch on this rank."""
    model, loss_fn, (images, labels) = zoo.resnet(4, image_size=16, width=8, blocks=(1, 1))
    reference = DistributedDataParallel(copy.deepcopy(model))

    def make_batch(number: int) -> tuple[torch.Tensor, torch.Tensor]:
        generator = torch.Generator().manual_seed(100 * number + dist.get_rank())
        return torch.randn(images.shape, generator=generator), torch.randint(0, 10, labels.shape, generator=generator)

    return DistributedDataParallel(model, bucket_cap_mb=0.01), loss_fn, reference, make_batch


def _resnet_below_its_peak() -> None:
    ddp, loss_fn, reference, make_batch = _resnet_on_ranks()

    options: dict[str, Any] = {"cost_model": "profile", "cache": False, "measure_memory": "never"}
    step = checkmate.compile(ddp, loss_fn, make_batch(0), budget=0.8, method="chen_greedy", **options)
    assert isinstance(step.distribution, DataParallel)
    assert step.plan.R.sum() > step.graph.size, "a tight budget must make the plan recompute"
    assert len(step.distribution.reduction.buckets) > 1, "a small bucket_cap_mb must make several buckets"
    assert step.graph.fixed_memory >= step.distribution.reduction.bucket_bytes
    _train(step, reference, make_batch)


def _resnet_moving_values_to_host_memory() -> None:
    """Moves to host memory beside DDP's gradient buckets: every long hold copied out and back (offload_all), the
    copies run on their worker threads while the buckets' all-reduces start."""
    ddp, loss_fn, reference, make_batch = _resnet_on_ranks()

    link = checkmate.LinkSpeeds(1e12, 1e12)
    options: dict[str, Any] = {"cost_model": "profile", "cache": False, "measure_memory": "never", "host_link": link}
    step = checkmate.compile(ddp, loss_fn, make_batch(0), budget=1.0, method="offload_all", **options)
    assert isinstance(step.distribution, DataParallel) and step.plan.moves.any
    _train(step, reference, make_batch)


def _unused_and_ignored_parameters() -> None:
    torch.manual_seed(0)
    model = UnusedHead()
    model.body[0].bias.requires_grad_(False)
    DistributedDataParallel._set_params_and_buffers_to_ignore_for_model(model, ["body.3.bias", "body.1.running_var"])
    reference = DistributedDataParallel(copy.deepcopy(model), find_unused_parameters=True)
    ddp = DistributedDataParallel(model, find_unused_parameters=True)

    def loss_fn(module: nn.Module, inputs: torch.Tensor) -> torch.Tensor:
        return module(inputs).square().mean()

    def make_batch(number: int) -> tuple[torch.Tensor]:
        return (torch.randn(6, 8, generator=torch.Generator().manual_seed(10 * number + dist.get_rank())),)

    options: dict[str, Any] = {"cost_model": "profile", "cache": False, "measure_memory": "never"}
    step = checkmate.compile(ddp, loss_fn, make_batch(0), budget=1.0, method="checkpoint_all", **options)
    assert isinstance(step.distribution, DataParallel)
    single_process = checkmate.capture(model, loss_fn, make_batch(0), cost_model="unit")
    synced = [buffer for name, buffer in model.named_buffers() if name != "body.1.running_var"]  # broadcast copies
    broadcast = sum(buffer.numel() * buffer.element_size() for buffer in synced)
    buckets = step.distribution.reduction.bucket_bytes
    assert step.graph.fixed_memory == single_process.graph.fixed_memory + buckets + broadcast
    _train(step, reference, make_batch)
    assert model.unused.weight.grad is None

    # a batch of another size on each rank: each replans alone (no collective), and the buckets still match; the
    # first call replans (profiling, which may not run inside the allocator's meter), the second is measured
    uneven = (torch.randn(3 + 2 * dist.get_rank(), 8, generator=torch.Generator().manual_seed(99)),)
    step(*uneven)
    loss_fn(reference, *uneven).backward()
    loss, measured = measured_call(step, uneven)
    expected = loss_fn(reference, *uneven)
    expected.backward()
    _assert_same(step, reference.module, loss, measured, expected)

    strict = DistributedDataParallel(copy.deepcopy(model))
    with pytest.raises(DataParallelError, match="find_unused_parameters=True"):
        checkmate.compile(strict, loss_fn, make_batch(0), budget=1.0, method="checkpoint_all", **options)


def _refuses_bucket_views() -> None:
    model, loss_fn, batch = zoo.mlp(4, width=8, depth=1)
    ddp = DistributedDataParallel(model, gradient_as_bucket_view=True)
    with pytest.raises(DataParallelError, match="gradient_as_bucket_view"):
        checkmate.compile(ddp, loss_fn, batch, budget=1.0, method="checkpoint_all", cost_model="unit")


def _failing_rank_stops_the_others() -> None:
    """Rank 1 cannot trace its loss; rank 0 must raise RankFailed naming it at once, not wait in the bucket
    broadcast until the process group's timeout."""
    model, loss_fn, batch = zoo.mlp(4, width=8, depth=1)
    ddp = DistributedDataParallel(model)

    def fails_on_rank_1(module: nn.Module, *inputs: torch.Tensor) -> torch.Tensor:
        if dist.get_rank() == 1:
            raise RuntimeError("rank 1 cannot trace this loss")
        return loss_fn(module, *inputs)

    started = time.perf_counter()
    expected = RankFailed if dist.get_rank() == 0 else CaptureError
    with pytest.raises(expected, match=r"\[1\]" if dist.get_rank() == 0 else "rank 1 cannot trace"):
        checkmate.compile(ddp, fails_on_rank_1, batch, budget=1.0, method="checkpoint_all", cost_model="unit")
    assert time.perf_counter() - started < 20, "a rank failing to plan must stop the others at once"


def _worker(rank: int, init_file: str) -> None:
    with gloo_ranks(rank, init_file, timeout=TIMEOUT):
        _resnet_below_its_peak()
        _resnet_moving_values_to_host_memory()
        _unused_and_ignored_parameters()
        _refuses_bucket_views()
        _failing_rank_stops_the_others()


@pytest.mark.slow
def test_matches_eager_ddp_on_two_ranks(tmp_path: Path) -> None:
    """ResNet with BatchNorm at 80 % of its peak with several buckets, and moving values to host memory; unused,
    ignored and frozen parameters, and batches of another size on each rank; gradient_as_bucket_view refused; a rank
    failing to plan stops the other at once. Each check runs on both ranks; a failure on either fails the test."""
    mp.spawn(_worker, args=(str(tmp_path / "rendezvous"),), nprocs=WORLD_SIZE, join=True)


@pytest.mark.parametrize("seed", range(5))
def test_buckets_as_ddp_cuts_them(seed: int) -> None:
    """`assign_buckets` against the Reducer's own `compute_bucket_assignment_by_size`, given a gradient order."""
    rng = random.Random(seed)
    tensors = [torch.empty(rng.choice([1, 10, 3_000, 70_000, 300_000])) for _ in range(rng.randint(1, 30))]
    order = list(range(len(tensors)))
    rng.shuffle(order)
    limits = [1024 * 1024, rng.choice([100_000, 2 * 1024 * 1024])]
    expected, _ = dist._compute_bucket_assignment_by_size(
        [tensors[index] for index in order], limits, [False] * len(tensors), order
    )
    positions = assign_buckets([tensors[index].numel() * 4 for index in order], [torch.float32] * len(order), limits)
    assert [[order[position] for position in bucket] for bucket in positions] == expected
