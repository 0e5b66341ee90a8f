"""`checkmate.backend(..., host_budget=...)`: a region's plan moves values to host memory and back inside the graphs
AOTAutograd runs (`checkmate.inductor.moved_region`).

Oracles: the same loop in eager PyTorch on a deep copy (losses and `.grad`s to float32 rounding), the CPU allocator's
peak during forward, loss and backward against the region's plan (host copies are numpy memory, which that allocator
does not count), and the host copies' bytes against `host_budget`. The link given for planning is far faster than
this machine's, so that moving is what the plan prefers whatever the machine.
"""

from __future__ import annotations

import copy
import gc
from collections.abc import Callable

import pytest
import torch
from test_transformers import _build
from torch import nn

import checkmate
from checkmate import InvalidArgument, LinkSpeeds, zoo
from checkmate.execute.memory import storage_bytes
from checkmate.torch_capture.allocator import allocator_peak

FAST = LinkSpeeds(1e12, 1e12, latency=0.0, overlap=1.0)
HOST_BUDGET = 64 << 20

pytestmark = pytest.mark.usefixtures("module_cache_directory", "fresh_dynamo")

DEVICES = [pytest.param("cpu"), pytest.param("cuda", marks=pytest.mark.gpu)]


def _gpt() -> tuple[nn.Module, torch.Tensor, Callable[[torch.Tensor], torch.Tensor]]:
    model, _, (tokens, targets) = zoo.gpt(batch_size=4, length=32, dim=64, heads=2, layers=2, vocab=64)
    return model, tokens, lambda logits: nn.functional.cross_entropy(logits.flatten(0, 1), targets.flatten())


def _mlp() -> nn.Module:
    layers = [layer for _ in range(3) for layer in (nn.Linear(128, 128), nn.Tanh())]
    return nn.Sequential(*layers, nn.Linear(128, 10))


@pytest.mark.slow
def test_a_region_that_moves_trains_as_eager_within_its_plan() -> None:
    """At the peak of moving every long hold (`offload_all`'s, about two thirds of the peak without recomputation),
    the optimal plan of the region moves values; three steps of a plain loop equal eager's, the allocator's peak stays
    within the plan, the host copies within `host_budget`, and no copy outlives its step."""
    torch.manual_seed(0)
    model, tokens, criterion = _gpt()
    reference = copy.deepcopy(model)
    moving_all = checkmate.backend(budget=1.0, method="offload_all", cost_model="flops", host_link=FAST)
    criterion(torch.compile(copy.deepcopy(model), backend=moving_all)(tokens)).backward()
    budget = moving_all.regions[0].plan.peak_memory
    torch._dynamo.reset()

    planner = checkmate.backend(
        budget=budget, cost_model="flops", host_link=FAST, host_budget=HOST_BUDGET, time_limit=15
    )
    compiled = torch.compile(model, backend=planner)
    optimizers = [torch.optim.SGD(each.parameters(), lr=0.1) for each in (model, reference)]
    for step in range(3):
        losses = []
        for each in (compiled, reference):
            torch.manual_seed(step)  # the same dropout masks
            losses.append(criterion(each(tokens)))
            losses[-1].backward()
        torch.testing.assert_close(losses[0], losses[1])
        for got, want in zip(model.parameters(), reference.parameters(), strict=True):
            torch.testing.assert_close(got.grad, want.grad)
        for optimizer in optimizers:
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
    (region,) = planner.regions
    plan = region.plan
    assert plan.moves.any and 0 < plan.host_peak <= HOST_BUDGET
    assert plan.peak_memory <= budget < 0.7 * region.no_remat_peak

    measured = allocator_peak(lambda: criterion(compiled(tokens)).backward())
    measured += storage_bytes([*model.parameters(), *model.buffers(), tokens])
    logits_bytes = 4 * tokens.numel() * 64
    assert measured <= plan.peak_memory + 3 * logits_bytes, (measured, plan.peak_memory)
    assert region.copier.in_flight == 0, "a step's copies end with its backward"
    assert 0 < region.copier.pooled_bytes <= plan.host_peak, "host copies are kept for the next step, one per move"


@pytest.mark.parametrize("device", DEVICES)
def test_copies_follow_their_forward_whatever_runs_between(device: str) -> None:
    """Two forwards before one backward (after a step that left its host copies for reuse) keep two sets of copies,
    each read back by its own backward (gradients equal eager's); a forward whose backward never runs lets go of its
    copies with its autograd graph. On CUDA the copies run on side streams into pinned host copies."""
    torch.manual_seed(0)
    model = _mlp().to(device)
    reference = copy.deepcopy(model)
    planner = checkmate.backend(budget=1.0, method="offload_all", cost_model="flops", host_link=FAST)
    compiled = torch.compile(model, backend=planner)
    first, second = torch.randn(32, 128, device=device), torch.randn(32, 128, device=device)
    compiled(first).sum().backward()
    model.zero_grad(set_to_none=True)
    (compiled(first).square().mean() + compiled(second).square().mean()).backward()
    (reference(first).square().mean() + reference(second).square().mean()).backward()
    for got, want in zip(model.parameters(), reference.parameters(), strict=True):
        torch.testing.assert_close(got.grad, want.grad)
    (region,) = planner.regions
    assert region.plan.moves.any
    assert region.copier.in_flight == 0

    output = compiled(first)
    assert region.copier.in_flight > 0, "the forward's copies wait for its backward"
    del output
    gc.collect()
    assert region.copier.in_flight == 0


@pytest.mark.slow
def test_a_hugging_face_model_moves_through_the_backend() -> None:
    """Hugging Face's GPT-2 (a tiny config, dropout on) with every long hold of each region moved (`offload_all`):
    three steps of a plain loop with SGD equal eager's (loss, gradients, parameters after each update), then an
    evaluation forward under `model.eval()` (a region of its own, no backward: its copies let go with its outputs)
    equal to eager's, and a training step after it."""
    model, loss_fn, batch = _build("gpt2")
    reference = copy.deepcopy(model)
    planner = checkmate.backend(budget=1.0, method="offload_all", cost_model="flops", host_link=FAST)
    compiled = torch.compile(model, backend=planner)
    optimizers = [torch.optim.SGD(each.parameters(), lr=0.1) for each in (model, reference)]

    def train_step(number: int) -> None:
        losses = []
        for each in (compiled, reference):
            torch.manual_seed(number)  # the same dropout masks
            losses.append(loss_fn(each, *batch))
            losses[-1].backward()
        torch.testing.assert_close(losses[0], losses[1], msg=f"step {number}")
        for got, want in zip(model.parameters(), reference.parameters(), strict=True):
            torch.testing.assert_close(got.grad, want.grad, msg=f"step {number}")
        for optimizer in optimizers:
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)

    for number in range(3):
        train_step(number)
    assert any(region.plan.moves.any for region in planner.regions), "the training regions move values"
    for each in (model, reference):
        each.eval()
    with torch.no_grad():
        torch.testing.assert_close(loss_fn(compiled, *batch), loss_fn(reference, *batch))
    for each in (model, reference):
        each.train()
    train_step(3)
    assert all(region.copier.in_flight == 0 for region in planner.regions)


def test_host_options_are_checked_before_any_compile() -> None:
    with pytest.raises(InvalidArgument, match="host_budget"):
        checkmate.backend(budget=0.5, host_budget="lots")
    with pytest.raises(InvalidArgument, match="LinkSpeeds"):
        checkmate.backend(budget=0.5, host_link=1e9)
