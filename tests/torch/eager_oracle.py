"""Eager PyTorch as the oracle for a compiled step: the same loss, `.grad`s and buffers, bit for bit, and the measured
peak within the plan's.

The reference is plain `loss_fn(model, *batch).backward()` on a deep copy of the model (deepcopy keeps tied
parameters tied), run under the same seed as the compiled step so that dropout draws the same masks.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

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


def assert_within_plan(step: CompiledStep, *, accumulating: bool) -> None:
    """The measured peak of the last step is at most the plan's. When the step accumulated into existing `.grad`s,
    every gradient was live for the whole step as the plan's fixed memory assumes, so there the plan must also be
    close (within 10 %, less the generator states the plan charges to random nodes, which the meter does not see);
    a step from `.grad = None` makes gradients one by one and may measure well below."""
    report = step.report()
    assert report.measured_peak is not None
    assert step.plan.budget is None or report.planned_peak <= report.budget
    assert report.measured_peak <= report.planned_peak, f"measured {report.measured_peak} above {report.planned_peak}"
    if accumulating:
        # the meter sees tensors made by ATen ops; the random states the plan charges to each random node are not
        random_states = len(step.captured.random_nodes) * random_state_bytes(torch.device("cpu"))
        assert report.measured_peak >= 0.9 * (report.planned_peak - random_states), "the plan should not be loose"


def compare_steps(
    step: CompiledStep, reference: nn.Module, batch: tuple[Any, ...], *, seed: int, context: str, exact: bool = True
) -> None:
    """One compiled step and one eager step under the same seed: equal loss and state, the peak within the plan."""
    accumulating = all(parameter.grad is not None for parameter in step.model.parameters() if parameter.requires_grad)
    torch.manual_seed(seed)
    loss = step(*batch)
    torch.manual_seed(seed)
    expected = step.loss_fn(reference, *batch)
    expected.backward()
    assert_equal(loss, expected.detach(), f"{context}: loss {loss.item()} != {expected.item()}", exact=exact)
    assert_same_state(step.model, reference, context, exact=exact)
    assert_within_plan(step, accumulating=accumulating)


def train_three_steps(
    step: CompiledStep, reference: nn.Module, batch: tuple[Any, ...], context: str, *, exact: bool = True
) -> None:
    """Step 1, an SGD update on both, step 2 from zeroed grads, step 3 accumulating into step 2's grads; the peak
    of each step (compiled with measure_memory="every") within the plan's."""
    optimizers = [torch.optim.SGD(m.parameters(), lr=0.1, momentum=0.9) for m in (step.model, reference)]
    compare_steps(step, reference, batch, seed=11, context=f"{context}, step 1", exact=exact)
    for optimizer in optimizers:
        optimizer.step()
        optimizer.zero_grad()
    compare_steps(step, reference, batch, seed=12, context=f"{context}, step 2 after an update", exact=exact)
    compare_steps(step, reference, batch, seed=13, context=f"{context}, step 3 accumulating", exact=exact)
