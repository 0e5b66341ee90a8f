"""`gradient_memory="when_made"`: gradients counted from the node that makes them, for steps whose `.grad`s start
empty. Oracles: the parameters' bytes, eager PyTorch's gradients (bit for bit), and the peak measured while the
step runs, which a plan for empty `.grad`s must bound tightly."""

from __future__ import annotations

import copy
from collections.abc import Iterator

import numpy as np
import pytest
import torch
from eager_oracle import compare_steps

import checkmate
from checkmate import ExecutionError, InvalidArgument, zoo
from checkmate.execute.memory import step_baseline, storage_bytes
from checkmate.torch_capture.allocator import allocator_peak


@pytest.fixture(scope="module", autouse=True)
def plan_cache_directory(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("CHECKMATE_CACHE_DIR", str(tmp_path_factory.mktemp("plans")))
        yield


def _gpt() -> tuple[torch.nn.Module, object, tuple[torch.Tensor, ...]]:
    return zoo.gpt(batch_size=4, length=16, dim=32, heads=2, layers=2, vocab=64)


def test_gradients_leave_the_fixed_memory_for_the_nodes_that_make_them() -> None:
    model, loss_fn, batch = _gpt()
    whole = checkmate.capture(model, loss_fn, batch, cost_model="flops")
    made = checkmate.capture(model, loss_fn, batch, cost_model="flops", gradient_memory="when_made")
    gradient_bytes = sum(parameter.numel() * parameter.element_size() for parameter in model.parameters())
    assert whole.graph.fixed_memory - made.graph.fixed_memory == gradient_bytes
    assert made.graph.retained.sum() - whole.graph.retained.sum() == gradient_bytes
    random = sorted(whole.random_nodes)
    assert whole.graph.retained.sum() == len(random) * torch.get_rng_state().numel()  # the dropouts' saved states
    made_by_backward = made.graph.retained - whole.graph.retained
    assert made_by_backward.sum() == gradient_bytes
    assert made.graph.is_backward[made_by_backward > 0].all()
    no_remat_whole = checkmate.solve(whole.graph, None, method="checkpoint_all")
    no_remat_made = checkmate.solve(made.graph, None, method="checkpoint_all")
    assert no_remat_made.cost == no_remat_whole.cost
    assert no_remat_made.peak_memory < no_remat_whole.peak_memory


def test_at_the_same_bytes_the_plan_recomputes_less() -> None:
    """The budget that holds everything when gradients count from their nodes forces recomputation when they count
    for the whole step."""
    model, loss_fn, batch = _gpt()
    made = checkmate.capture(model, loss_fn, batch, cost_model="flops", gradient_memory="when_made")
    whole = checkmate.capture(model, loss_fn, batch, cost_model="flops")
    budget = checkmate.solve(made.graph, None, method="checkpoint_all").peak_memory
    plan_made = checkmate.solve(made.graph, budget, method="optimal", time_limit=20)
    plan_whole = checkmate.solve(whole.graph, budget, method="optimal", time_limit=20)
    assert plan_made.cost == pytest.approx(float(made.graph.costs.sum()))
    assert plan_whole.cost > plan_made.cost


@pytest.mark.parametrize("budget", [1.0, 0.75])
def test_matches_eager_and_the_measured_peak_is_within_and_near_the_plan(budget: float) -> None:
    model, loss_fn, batch = _gpt()
    reference = copy.deepcopy(model)
    method, options = ("checkpoint_all", {}) if budget == 1.0 else ("optimal", {"time_limit": 20})
    step = checkmate.compile(
        model, loss_fn, batch, budget=budget, method=method, cost_model="profile", measure_memory="never",
        gradient_memory="when_made", **options,
    )  # fmt: skip
    optimizers = [torch.optim.SGD(m.parameters(), lr=0.1) for m in (model, reference)]
    for seed in (1, 2):
        measured = compare_steps(step, reference, batch, seed=seed, context=f"when_made at {budget}, step {seed}")
        assert measured >= 0.9 * step.plan.peak_memory, "from empty .grads the plan should be tight"
        for optimizer in optimizers:
            optimizer.step()
            optimizer.zero_grad()


def test_a_step_with_gradients_already_held_is_refused() -> None:
    model, loss_fn, batch = _gpt()
    step = checkmate.compile(
        model, loss_fn, batch, budget=1.0, method="checkpoint_all", cost_model="flops", gradient_memory="when_made"
    )
    step(*batch)
    with pytest.raises(ExecutionError, match="zero_grad"):
        step(*batch)
    model.zero_grad()
    step(*batch)


def test_an_unknown_gradient_memory_is_refused() -> None:
    model, loss_fn, batch = _gpt()
    with pytest.raises(InvalidArgument, match="gradient_memory"):
        checkmate.compile(model, loss_fn, batch, budget=1.0, gradient_memory="sometimes")


@pytest.mark.parametrize("budget", [1.0, 0.8])
def test_the_cpu_allocator_reads_the_plan_s_peak_with_dropout(budget: float) -> None:
    """With profiled scratch, gradients counted from their nodes and the generator state of each dropout retained,
    the allocator's own peak over the step (the `torch.profiler` meter) is at most the plan's, and within 3 % of it
    once the states of dropouts the schedule never recomputes (charged, but not saved) are set aside."""
    torch.manual_seed(0)
    model, loss_fn, batch = zoo.gpt(batch_size=4, length=16, dim=32, heads=2, layers=2, vocab=64, dropout=0.1)
    method, options = ("checkpoint_all", {}) if budget == 1.0 else ("optimal", {"time_limit": 20})
    step = checkmate.compile(
        model, loss_fn, batch, budget=budget, method=method, cost_model="profile", measure_memory="never",
        gradient_memory="when_made", **options,
    )  # fmt: skip
    assert step.graph.retained[sorted(step.captured.random_nodes)].min() > 0
    step(*batch)
    model.zero_grad()
    measured = storage_bytes(step_baseline(model, batch)) + allocator_peak(lambda: step(*batch))
    recomputed = {int(node) for node in np.flatnonzero(np.tril(step.plan.R, k=-1).any(axis=0))}
    unsaved = len(step.captured.random_nodes - recomputed) * torch.get_rng_state().numel()  # charged, never saved
    assert 0.97 * (step.plan.peak_memory - unsaved) <= measured <= step.plan.peak_memory
