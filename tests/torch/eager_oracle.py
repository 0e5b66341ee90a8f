"""Eager PyTorch as the oracle for a compiled step: the same loss, `.grad`s and buffers, bit for bit, and the peak
the allocator held during the step within the plan's.

The reference is plain `loss_fn(model, *batch).backward()` on a deep copy of the model (deepcopy keeps tied
parameters tied), run under the same seed as the compiled step so that dropout draws the same masks. The peak is
read from the allocator (`measured_call`), which sees kernel scratch and saved generator states; steps measured here
are compiled with `measure_memory="never"`.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from torch import nn

from checkmate.execute import measure_peak, step_baseline, storage_bytes
from checkmate.plan import cheapest_r, make_plan
from checkmate.torch_capture import random_state_bytes
from checkmate.training.compiled import CompiledStep


def assert_equal(got: torch.Tensor, want: torch.Tensor, message: str, *, exact: bool = True) -> None:
    """Bit for bit, or with `exact=False` within float32 rounding (torch.testing's default tolerances)."""
    if exact:
        assert torch.equal(got, want), message
    else:
        torch.testing.assert_close(got, want, msg=message)


def assert_same_state(model: nn.Module, reference: nn.Module, context: str, *, exact: bool = True) -> None:
    """Every name of every parameter (duplicates included, so a tie the step broke shows) has the reference's `.grad`
    (present or not, equal, in the same layout), and every buffer equals the reference's."""
    got_parameters = dict(model.named_parameters(remove_duplicate=False))
    for name, want in reference.named_parameters(remove_duplicate=False):
        got = got_parameters[name]
        assert (got.grad is None) == (want.grad is None), f"{context}: {name}.grad presence differs"
        if want.grad is not None:
            assert_equal(got.grad, want.grad, f"{context}: {name}.grad differs", exact=exact)
            assert got.grad.stride() == want.grad.stride(), f"{context}: {name}.grad has another layout"
    for (name, got), (_, want) in zip(model.named_buffers(), reference.named_buffers(), strict=True):
        assert_equal(got, want, f"{context}: buffer {name} differs", exact=exact)


def recompute_everything(step: CompiledStep) -> None:
    """Make `step` run the plan that holds nothing between stages: every value is recomputed where it is read."""
    size = step.graph.size
    nothing = np.zeros((size, size), dtype=bool)
    step.use_plan(make_plan(step.graph, cheapest_r(step.graph, nothing), nothing, method="recompute_everything"))


def measured_call(step: CompiledStep, batch: tuple[Any, ...]) -> tuple[torch.Tensor, int]:
    """`step(*batch)`'s loss, and the peak bytes of the step counted as the plan counts them: the storages it starts
    with (parameters, `.grad`s, buffers, the batch) plus the most the allocator held above its level at the start.

    On CPU the allocator's own events are read (`measure_peak(allocator=True)`), so kernel scratch and saved generator
    states count; on CUDA, `torch.cuda.max_memory_allocated`. The step must not meter itself (compile it with
    `measure_memory="never"`): a second profiler session inside this one would end it.
    """
    baseline = step_baseline(step.model, batch)
    with measure_peak(baseline[0].device, baseline, allocator=True) as meter:
        loss = step(*batch)
    assert meter.peak_bytes > storage_bytes(baseline), "the allocator saw no allocation: did the step meter itself?"
    return loss, meter.peak_bytes


def assert_within_plan(step: CompiledStep, measured: int, *, accumulating: bool) -> None:
    """`measured`, the allocator's peak of the last step, is at most the plan's. When the step accumulated into
    existing `.grad`s, every gradient was live for the whole step as the plan's fixed memory assumes, so there the
    plan must also be close (within 10 %, less the generator states the plan charges to every random node, which are
    saved only for the ones the schedule recomputes); a step from `.grad = None` makes gradients one by one and may
    measure well below."""
    planned = step.plan.peak_memory
    assert step.plan.budget is None or planned <= step.plan.budget
    assert measured <= planned, f"the allocator held {measured} bytes, above the plan's {planned}"
    if accumulating:
        random_states = len(step.captured.random_nodes) * random_state_bytes(torch.device("cpu"))
        assert measured >= 0.9 * (planned - random_states), f"the plan should not be loose: {measured} of {planned}"


def compare_steps(
    step: CompiledStep, reference: nn.Module, batch: tuple[Any, ...], *, seed: int, context: str, exact: bool = True
) -> int:
    """One compiled step and one eager step under the same seed: equal loss and state, the allocator's peak within
    the plan's; returns that peak."""
    accumulating = all(parameter.grad is not None for parameter in step.model.parameters() if parameter.requires_grad)
    torch.manual_seed(seed)
    loss, measured = measured_call(step, batch)
    torch.manual_seed(seed)
    expected = step.loss_fn(reference, *batch)
    expected.backward()
    assert_equal(loss, expected.detach(), f"{context}: loss {loss.item()} != {expected.item()}", exact=exact)
    assert_same_state(step.model, reference, context, exact=exact)
    assert_within_plan(step, measured, accumulating=accumulating)
    return measured


def train_three_steps(
    step: CompiledStep, reference: nn.Module, batch: tuple[Any, ...], context: str, *, exact: bool = True
) -> None:
    """Step 1, an SGD update on both, step 2 from zeroed grads, step 3 accumulating into step 2's grads; the
    allocator's peak of each step within the plan's."""
    optimizers = [torch.optim.SGD(m.parameters(), lr=0.1, momentum=0.9) for m in (step.model, reference)]
    compare_steps(step, reference, batch, seed=11, context=f"{context}, step 1", exact=exact)
    for optimizer in optimizers:
        optimizer.step()
        optimizer.zero_grad()
    compare_steps(step, reference, batch, seed=12, context=f"{context}, step 2 after an update", exact=exact)
    compare_steps(step, reference, batch, seed=13, context=f"{context}, step 3 accumulating", exact=exact)
