"""`checkmate.compile(..., executor=...)` of a DistributedDataParallel model and of a model sharded by FSDP2's
`fully_shard`, against eager DDP and eager FSDP2, with 2 CPU processes on gloo.

Each executor runs the same loop: a budget that makes the plan recompute, three SGD steps, then one step accumulating
locally (DDP's `no_sync()`, FSDP2's `set_requires_gradient_sync(False)`) and the synchronised step that adds to it
before the optimizer's step. The oracle on each rank is the same loop run by eager DDP or eager FSDP2 on a copy of the
model, fed the same per-rank batches. After every call the loss and the gradients (FSDP2: this rank's gradient shards)
must equal the oracle's: bit for bit with the eager executor, to float32 rounding with the Inductor one
(`torch.testing.assert_close`'s float32 defaults, rtol 1.3e-6 and atol 1e-5: Inductor fuses and reorders the
arithmetic, and on this model single-process Inductor's gradients are within 3e-8 of eager's over four steps,
gradients up to 0.2, so the defaults leave a wide margin while a missing all-reduce, a gradient added twice or a value
recomputed from the wrong inputs is off by the size of a gradient). The first call is metered by the step
(`measure_memory="first"`): its measured per-rank peak must be at or below its planned one. With Inductor, runs of
compiled nodes must be fused as in a single-process step: the distribution's steps (DDP's bucket reductions, FSDP2's
gathers and frees) placed among them, not replacing the fusion.
"""

from __future__ import annotations

import copy
import datetime
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from eager_oracle import assert_equal
from gloo_ranks import WORLD_SIZE, gloo_ranks
from torch import nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import FSDPModule, fully_shard
from torch.distributed.tensor import DTensor
from torch.nn.parallel import DistributedDataParallel

import checkmate
from checkmate.execute.codegen import SegmentCall
from checkmate.training.compiled import CompiledStep

TIMEOUT = datetime.timedelta(seconds=240)  # a rank may wait in a collective while the other compiles with Inductor
WIDTH = 16
BUDGET = 0.85  # of the no-recomputation peak: below it, so the plan recomputes, and above chen_greedy's smallest
OPTIONS: dict[str, Any] = {
    "method": "chen_greedy",
    "cost_model": "flops",  # no profiling
    "max_nodes": 20,  # Inductor compiles each planning node: fewer nodes, a shorter compile
    "cache": False,
    "measure_memory": "first",
}

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("module_cache_directory")]


class Block(nn.Module):
    """A pre-norm residual MLP block; `fully_shard` goes on each block and on the root."""

    def __init__(self) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(WIDTH)
        self.up = nn.Linear(WIDTH, 2 * WIDTH)
        self.down = nn.Linear(2 * WIDTH, WIDTH)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        return hidden + self.down(nn.functional.gelu(self.up(self.norm(hidden))))


def _blocks() -> nn.Sequential:
    """An input projection, three blocks and a head."""
    return nn.Sequential(nn.Linear(8, WIDTH), *(Block() for _ in range(3)), nn.Linear(WIDTH, 4))


def loss_fn(model: nn.Module, inputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    return nn.functional.mse_loss(model(inputs), targets)


def make_batch(number: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Step `number`'s batch on this rank: one shape on every rank (FSDP2 refuses uneven inputs), other values."""
    generator = torch.Generator().manual_seed(100 * number + dist.get_rank())
    return torch.randn(64, 8, generator=generator), torch.randn(64, 4, generator=generator)


def _ddp_pair() -> tuple[nn.Module, nn.Module]:
    torch.manual_seed(0)
    model = _blocks()
    reference = copy.deepcopy(model)
    return DistributedDataParallel(model), DistributedDataParallel(reference)


def _sharded(model: nn.Sequential) -> nn.Sequential:
    mesh = init_device_mesh("cpu", (WORLD_SIZE,))
    for block in list(model)[1:-1]:
        fully_shard(block, mesh=mesh)
    fully_shard(model, mesh=mesh)
    return model


def _fsdp_pair() -> tuple[nn.Module, nn.Module]:
    torch.manual_seed(0)
    model = _blocks()
    reference = copy.deepcopy(model)
    return _sharded(model), _sharded(reference)


def _gradients(model: nn.Module) -> Iterator[tuple[str, torch.Tensor | None]]:
    """Each parameter's gradient as this rank holds it: a sharded one's local shard."""
    for name, parameter in model.named_parameters():
        gradient = parameter.grad
        yield name, gradient.to_local() if isinstance(gradient, DTensor) else gradient


def _assert_same(model: nn.Module, reference: nn.Module, exact: bool, context: str) -> None:
    for (name, got), (_, want) in zip(_gradients(model), _gradients(reference), strict=True):
        assert (got is None) == (want is None), f"{context}: {name}.grad presence differs"
        if got is not None and want is not None:
            assert_equal(got, want, f"{context}: {name}'s gradient differs from the oracle's", exact=exact)


def _runs_fused(step: CompiledStep) -> bool:
    """Whether the step runs some of its schedule as fused runs of compiled nodes (as `test_inductor` reads it):
    the Inductor executor's rewrite of the schedule composed with the distribution's, not replaced by it."""
    compiled = step.compiled
    return any(isinstance(item, SegmentCall) for item in compiled.program.lowered(compiled.schedule))


def _no_sync_ddp(model: nn.Module) -> AbstractContextManager[None]:
    assert isinstance(model, DistributedDataParallel)
    return model.no_sync()


@contextmanager
def _no_sync_fsdp(model: nn.Module) -> Iterator[None]:
    assert isinstance(model, FSDPModule)
    model.set_requires_gradient_sync(False)
    try:
        yield
    finally:
        model.set_requires_gradient_sync(True)


def _train_against_eager(
    make_pair: Callable[[], tuple[nn.Module, nn.Module]],
    no_sync: Callable[[nn.Module], AbstractContextManager[None]],
    executor: str,
    *,
    moving: bool = False,
) -> None:
    """Five steps against eager at a budget that makes the plan recompute or (`moving`) with every long hold moved to
    host memory (`offload_all`, a link priced far faster than this machine's)."""
    model, reference = make_pair()
    if moving:
        link = checkmate.LinkSpeeds(1e12, 1e12, latency=0.0, overlap=1.0)
        options = {**OPTIONS, "budget": 1.0, "method": "offload_all", "host_link": link}
    else:
        options = {**OPTIONS, "budget": BUDGET}
    step = checkmate.compile(model, loss_fn, make_batch(0), executor=executor, **options)
    assert isinstance(step, CompiledStep)
    if moving:
        assert step.plan.moves.any, "the plan moves values to host memory"
    else:
        assert step.plan.R.sum() > step.graph.size, "the budget must make the plan recompute"
    if executor == "inductor":
        assert _runs_fused(step), "runs of compiled nodes are fused alongside DDP's or FSDP2's own steps"
    exact = executor == "eager"
    optimizers = [torch.optim.SGD(each.parameters(), lr=0.1, momentum=0.9) for each in (model, reference)]

    def one_step(number: int) -> None:
        batch = make_batch(number)
        loss = step(*batch)
        expected = loss_fn(reference, *batch)
        expected.backward()
        context = f"rank {dist.get_rank()}, {executor}, step {number}"
        assert_equal(loss, expected.detach(), f"{context}: loss {loss.item()} != {expected.item()}", exact=exact)
        _assert_same(model, reference, exact, context)

    for number in range(1, 4):
        one_step(number)
        if number == 1:
            report = step.report()
            assert report.measured_peak is not None, "the first call is metered (measure_memory='first')"
            assert report.measured_peak <= report.planned_peak, (
                f"rank {dist.get_rank()}: measured {report.measured_peak}, planned {report.planned_peak}"
            )
        for optimizer in optimizers:
            optimizer.step()
            optimizer.zero_grad()
    with no_sync(model), no_sync(reference):
        one_step(4)  # accumulates on this rank only
    one_step(5)  # synchronised, adding to what step 4 left
    for optimizer in optimizers:
        optimizer.step()


def _ddp(executor: str) -> None:
    _train_against_eager(_ddp_pair, _no_sync_ddp, executor)


def _fsdp2(executor: str) -> None:
    _train_against_eager(_fsdp_pair, _no_sync_fsdp, executor)


def _fsdp2_moving(executor: str) -> None:
    _train_against_eager(_fsdp_pair, _no_sync_fsdp, executor, moving=True)


def _worker(rank: int, init_file: str, check: Callable[[str], None], executor: str) -> None:
    with gloo_ranks(rank, init_file, timeout=TIMEOUT):
        check(executor)


@pytest.mark.parametrize("executor", ["eager", "inductor"])
def test_ddp_matches_eager_ddp(tmp_path: Path, executor: str) -> None:
    mp.spawn(_worker, args=(str(tmp_path / "rendezvous"), _ddp, executor), nprocs=WORLD_SIZE, join=True)


@pytest.mark.parametrize("executor", ["eager", "inductor"])
def test_fsdp2_matches_eager_fsdp2(tmp_path: Path, executor: str) -> None:
    mp.spawn(_worker, args=(str(tmp_path / "rendezvous"), _fsdp2, executor), nprocs=WORLD_SIZE, join=True)


def test_fsdp2_with_moves_to_host_memory_runs_fused_as_eager_fsdp2(tmp_path: Path) -> None:
    mp.spawn(_worker, args=(str(tmp_path / "rendezvous"), _fsdp2_moving, "inductor"), nprocs=WORLD_SIZE, join=True)
