"""Moves to host memory as the step runs them (`checkmate.execute.host_copies`): plans that copy values out and back
run bit-equal to eager PyTorch, the allocator's peak within the plan's (host copies live outside the device meter),
host bytes within `host_budget`; the copies' placement among the steps; the link measured and cached.

The link given for planning is far faster than this machine's (`FAST`), so that moving is what the plan prefers and
the tests run moves whatever the machine; the measured link is tested apart."""

from __future__ import annotations

import copy
from collections.abc import Iterator

import numpy as np
import pytest
import torch
from eager_oracle import compare_steps, train_three_steps

import checkmate
from checkmate import InvalidArgument, LinkSpeeds, zoo
from checkmate.execute.codegen import SegmentCall
from checkmate.execute.host_copies import (
    EndCopyIn,
    EndCopyOut,
    HostCopier,
    HostMoves,
    StartCopyIn,
    StartCopyOut,
    placed_copies,
)
from checkmate.execute.host_link import measured_link_speeds
from checkmate.execute.memory import measure_peak
from checkmate.simulate import Compute, Free
from checkmate.strategies.offload import offloaded
from checkmate.torch_capture.link_timing import cache_file
from checkmate.training.compiled import CompiledStep

FAST = LinkSpeeds(1e12, 1e12, latency=0.0, overlap=1.0)

MODELS = {
    "gpt": lambda: zoo.gpt(batch_size=4, length=32, dim=64, heads=2, layers=2, vocab=64),
    "resnet": lambda: zoo.resnet(batch_size=4, image_size=16, width=8, blocks=(1, 1)),
}


@pytest.fixture(scope="module", autouse=True)
def cache_directory(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("CHECKMATE_CACHE_DIR", str(tmp_path_factory.mktemp("caches")))
        yield


def _copier(step: CompiledStep) -> HostCopier:
    (moves,) = [each for each in step._compiled[step._current].program.passes if isinstance(each, HostMoves)]
    return moves.copier


def _host_bytes(step: CompiledStep) -> int:
    return sum(host.numel() for hosts in _copier(step).host_copies.values() for host in hosts)


def _gpt_step(*, budget: float, method: str) -> tuple[CompiledStep, torch.nn.Module, tuple[torch.Tensor, ...]]:
    """The small GPT's step by `method` at `budget` with the `FAST` link (FLOP costs), an eager copy, its batch."""
    model, loss_fn, batch = MODELS["gpt"]()
    reference = copy.deepcopy(model)
    step = checkmate.compile(
        model, loss_fn, batch, budget=budget, method=method, cost_model="flops", measure_memory="never", host_link=FAST
    )
    return step, reference, batch


@pytest.mark.parametrize("name", sorted(MODELS))
def test_a_plan_that_moves_runs_exactly_within_its_peak(name: str) -> None:
    """At the peak of moving every long hold (`offload_all`, about 60 % of the peak without recomputation), with a
    link that makes moving cheaper than recomputing, the optimal plan moves values (profiled costs: the plan counts
    the convolutions' scratch, which the allocator sees); three training steps equal eager's bit for bit and the
    allocator's peak stays within the plan."""
    model, loss_fn, batch = MODELS[name]()
    reference = copy.deepcopy(model)
    options = {"cost_model": "profile", "measure_memory": "never", "host_link": FAST, "host_budget": "64MiB"}
    moving_all = checkmate.compile(model, loss_fn, batch, budget=1.0, method="offload_all", **options)
    budget = moving_all.plan.peak_memory
    step = checkmate.compile(model, loss_fn, batch, budget=budget, time_limit=20, **options)
    plan = step.plan
    assert plan.moves.any and plan.host_peak > 0
    assert plan.peak_memory <= budget < 0.7 * step.compiled.no_remat.peak_memory
    train_three_steps(step, reference, batch, f"{name} with moves")
    assert 0 < _host_bytes(step) <= plan.host_peak <= 64 << 20
    copier = _copier(step)
    assert not copier.outbound and not copier.inbound, "a step keeps no device value past its end"


def test_a_plan_that_recomputes_and_moves_runs_exactly() -> None:
    """A recomputing plan (Chen's greedy at 70 %) with its long holds moved to host memory: both kinds of step in one
    schedule, bit-equal to eager, within its peak, which is below the recomputing plan's."""
    step, reference, batch = _gpt_step(budget=0.7, method="chen_greedy")
    recomputing = step.plan
    mixed = offloaded(step.graph, recomputing, method="chen_greedy, moved")
    assert mixed.moves.any and (mixed.R.sum() > step.graph.size)
    assert mixed.peak_memory < recomputing.peak_memory
    step.use_plan(mixed)
    compare_steps(step, reference, batch, seed=3, context="recomputes and moves")


def test_the_inductor_executor_runs_moves_between_its_fused_calls() -> None:
    """Compiled runs never cross a copy (the copies are placed first, `checkmate.execute.passes`): the step runs
    fused calls and copies, within the plan's peak on the allocator, with eager's gradients to rounding."""
    model, loss_fn, batch = zoo.mlp(batch_size=64, width=256, depth=4)
    reference = copy.deepcopy(model)
    step = checkmate.compile(
        model, loss_fn, batch, budget=1.0, method="offload_all", executor="inductor", measure_memory="never",
        host_link=FAST,
    )  # fmt: skip
    assert step.plan.moves.any
    kinds = {type(item) for item in step.compiled.program.run_steps(step.compiled.schedule)}
    assert {StartCopyOut, EndCopyOut, StartCopyIn, EndCopyIn} <= kinds and SegmentCall in kinds
    compare_steps(step, reference, batch, seed=5, context="inductor with moves", exact=False)


def test_host_budget_caps_what_moves() -> None:
    model, loss_fn, batch = MODELS["gpt"]()
    uncapped = checkmate.compile(
        model, loss_fn, batch, budget=1.0, method="offload_all", cost_model="flops", host_link=FAST, cache=False
    )
    cap = uncapped.plan.host_peak // 3
    capped = checkmate.compile(
        model, loss_fn, batch, budget=1.0, method="offload_all", cost_model="flops", host_link=FAST,
        host_budget=cap, measure_memory="never", cache=False,
    )  # fmt: skip
    assert 0 < capped.plan.host_peak <= cap
    reference = copy.deepcopy(model)
    compare_steps(capped, reference, batch, seed=4, context="capped host memory")
    assert _host_bytes(capped) <= cap


def test_the_report_gives_the_moves() -> None:
    model, loss_fn, batch = MODELS["resnet"]()
    step = checkmate.compile(model, loss_fn, batch, budget=1.0, method="offload_all", cost_model="profile",
                             host_link=FAST)  # fmt: skip
    step(*batch)
    report = step.report()
    assert report.moves is not None
    assert report.moves.host_peak == step.plan.host_peak > 0
    assert report.moves.bytes_to_host == step.plan.host_peak
    assert report.moves.bytes_to_device >= report.moves.bytes_to_host
    assert report.moves.transfer_time > 0 and 0.0 <= report.moves.hidden <= 1.0
    assert "host memory" in str(report)


def test_moves_need_a_cost_model_with_time() -> None:
    model, loss_fn, batch = zoo.mlp(batch_size=4)
    with pytest.raises(InvalidArgument, match="unit"):
        checkmate.compile(model, loss_fn, batch, budget=1.0, cost_model="unit", host_budget="1GiB")
    with pytest.raises(InvalidArgument, match="host_budget"):
        checkmate.compile(model, loss_fn, batch, budget=1.0, host_budget="lots")


def test_a_copy_back_rebuilds_values_bit_for_bit_with_their_aliasing() -> None:
    """A node's exports that share a storage come back sharing one, with their dtype, shape, strides and offset; the
    host copies are not counted by the device meter, the copy back's buffer is, once."""
    base = torch.randn(6, 5)
    values = (base, base.t()[1:], torch.arange(7, dtype=torch.int64), 3)
    copier = HostCopier()
    with measure_peak(torch.device("cpu"), list(values[:3])) as meter:
        copier.copy_out(0, values)
        copier.end_copy_out(0)
    assert meter.peak_bytes == base.nbytes + values[2].nbytes
    with measure_peak(torch.device("cpu"), []) as meter:
        copier.copy_in(0, 2)
        back = copier.end_copy_in(0, 2)
        del back
    assert meter.peak_bytes == base.nbytes + values[2].nbytes
    copier.copy_in(0, 3)
    back = copier.end_copy_in(0, 3)
    for got, want in zip(back[:3], values[:3], strict=True):
        assert torch.equal(got, want) and got.stride() == want.stride() and got.dtype == want.dtype
        assert got.storage_offset() == want.storage_offset()
    assert back[0].untyped_storage().data_ptr() == back[1].untyped_storage().data_ptr()
    assert back[0].untyped_storage().data_ptr() != base.untyped_storage().data_ptr()
    assert back[3] == 3


def test_copies_are_placed_where_the_memory_model_counts_them() -> None:
    """Node 0 made in stage 0, copied out there, read in stage 1, copied back for stage 3: its copy ends before its
    free in stage 1, the copy back starts at stage 2's start and ends at stage 3's."""
    copy_out = np.zeros((4, 4), dtype=bool)
    copy_in = np.zeros((4, 4), dtype=bool)
    copy_out[0, 0] = copy_in[3, 0] = True
    steps = (
        Compute(0, 0),
        Compute(1, 1),
        Free(0, 1),
        Compute(2, 2),
        Free(1, 2),
        Compute(3, 3),
        Free(0, 3),
        Free(2, 3),
        Free(3, 3),
    )
    copier = HostCopier()
    buffered = np.zeros((4, 4), dtype=bool)
    buffered[2, 0] = True
    placed = placed_copies(steps, copy_out, copy_in, buffered, copier)
    assert [type(step).__name__ + str((step.node, step.stage)) for step in placed] == [
        "Compute(0, 0)",
        "StartCopyOut(0, 0)",
        "Compute(1, 1)",
        "EndCopyOut(0, 0)",
        "Free(0, 1)",
        "StartCopyIn(0, 3)",
        "Compute(2, 2)",
        "Free(1, 2)",
        "EndCopyIn(0, 3)",
        "Compute(3, 3)",
        "Free(0, 3)",
        "Free(2, 3)",
        "Free(3, 3)",
    ]
    assert {type(step) for step in placed} >= {StartCopyOut, EndCopyOut, StartCopyIn, EndCopyIn}


def test_the_link_is_measured_once_and_cached() -> None:
    device = torch.device("cpu")
    path = cache_file(device)
    path.unlink(missing_ok=True)
    speeds = measured_link_speeds(device)
    assert speeds.to_host > 1e8 and speeds.to_device > 1e8  # any machine copies more than 100 MB/s
    assert speeds.latency >= 0 and 0.0 <= speeds.overlap <= 1.0
    assert path.exists()
    assert measured_link_speeds(device) == speeds


def test_a_smaller_last_batch_and_a_mode_switch_run_their_moves_exactly() -> None:
    """After compile with a host link, a smaller last batch runs the compiled batch's plan, moves included, at its own
    sizes (`checkmate.training.shape_reuse`); eval() then, into the gradients the steps before made, gets a plan of
    its own that moves values too (the link and the method carry over). Each step bit-equal to eager within its
    plan's peak: a state planned while the step runs measures nothing on the device (the link's price in FLOPs is
    measured once)."""
    step, reference, batch = _gpt_step(budget=1.0, method="offload_all")
    model = step.model
    compare_steps(step, reference, batch, seed=3, context="compiled batch")
    first = step.plan
    smaller = tuple(tensor[:2] for tensor in batch)
    compare_steps(step, reference, smaller, seed=4, context="smaller last batch with moves")
    assert step.plan is not first and step.plan.moves.any
    assert (step.plan.moves.copy_out == first.moves.copy_out).all()
    for module in (model, reference):
        module.eval()
    compare_steps(step, reference, batch, seed=5, context="eval() with moves, accumulating")
    assert step.plan.moves.any and step.graph.host_link is not None
