"""`executor="inductor"`: plans run by Inductor-compiled nodes, against eager PyTorch and the CPU allocator.

Oracles: plain `loss_fn(model, *batch).backward()` on a deep copy (loss, every `.grad`, BatchNorm buffers; to float32
rounding, since Inductor's decompositions round differently; dropout masks are eager's because random nodes run as
ATen ops), and the allocator's own peak during each step (it sees Inductor's buffers, which no dispatch hook does).
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

import pytest
import torch
from eager_oracle import train_three_steps

import checkmate
import checkmate.inductor.measure
import checkmate.solving
import checkmate.training.planning
from checkmate import InfeasibleBudget, InvalidArgument, zoo
from checkmate.execute.codegen import SegmentCall
from checkmate.execute.memory import storage_bytes
from checkmate.torch_capture.allocator import allocator_peak
from checkmate.torch_capture.fusion import fusible, is_extern

TIME_LIMIT = 15


def _gpt2() -> tuple[torch.nn.Module, Callable[..., torch.Tensor], tuple[torch.Tensor, ...]]:
    transformers = pytest.importorskip("transformers")
    config = transformers.GPT2Config(vocab_size=64, n_positions=16, n_embd=32, n_layer=2, n_head=2)
    tokens = torch.randint(2, 64, (2, 16), generator=torch.Generator().manual_seed(1))
    return transformers.GPT2LMHeadModel(config), lambda model, ids: model(input_ids=ids, labels=ids).loss, (tokens,)


MODELS: dict[str, Callable[[], Any]] = {
    "resnet": lambda: zoo.resnet(batch_size=4, image_size=16, width=8, blocks=(1, 1)),
    "gpt": lambda: zoo.gpt(batch_size=4, length=16, dim=32, heads=2, layers=2, vocab=64),
    "hf-gpt2": _gpt2,
}


pytestmark = pytest.mark.usefixtures("module_cache_directory")


def _build(name: str) -> Any:
    torch.manual_seed(0)
    model, loss_fn, batch = MODELS[name]()
    model.train()
    return model, loss_fn, batch


def _compile(model: Any, loss_fn: Any, batch: Any, budget: float | int, measure: str = "every") -> Any:
    return checkmate.compile(
        model,
        loss_fn,
        batch,
        budget=budget,
        executor="inductor",
        cost_model="flops",
        measure_memory=measure,
        time_limit=TIME_LIMIT,
    )


@pytest.mark.slow
@pytest.mark.parametrize(("name", "budget"), [(name, budget) for name in MODELS for budget in (1.0, 0.75)], ids=str)
def test_matches_eager_and_the_allocator_stays_within_plan(name: str, budget: float) -> None:
    model, loss_fn, batch = _build(name)
    reference = copy.deepcopy(model)
    step = _compile(model, loss_fn, batch, budget, measure="never")  # train_three_steps reads the allocator itself
    if budget < 1.0:
        assert step.plan.R.sum() > step.graph.size, "the tight budget must make the plan recompute"
    train_three_steps(step, reference, batch, f"{name} at {budget:.0%} on Inductor", exact=False)
    compiled = step._compiled[step._current]
    fused = any(isinstance(item, SegmentCall) for item in compiled.program.lowered(compiled.schedule))
    assert fused, "runs of compiled nodes are fused, in a recomputing schedule too"


@pytest.mark.slow
def test_a_recomputation_is_not_merged_away() -> None:
    """At a budget below what the no-recomputation plan measures, the step must recompute to fit: a compiled step that
    kept the value instead (common-subexpression elimination, a lifetime stretched by reordering) would measure above
    the budget on the allocator."""
    model, loss_fn, batch = _build("resnet")
    full = _compile(model, loss_fn, batch, 1.0)
    model.zero_grad(set_to_none=True)
    full(*batch)
    no_remat_peak = full.report().measured_peak  # the allocator's (measure_memory="every")
    budget = int(0.7 * full.plan.peak_memory)
    assert no_remat_peak is not None and budget < no_remat_peak
    step = _compile(model, loss_fn, batch, budget, measure="first")  # the second call is not metered by the step
    assert int(step.plan.R.sum()) > step.graph.size
    model.zero_grad(set_to_none=True)
    step(*batch)
    measured = step.report().measured_peak
    assert measured is not None and measured <= step.plan.peak_memory <= budget, (
        f"measured {measured}, planned {step.plan.peak_memory}, budget {budget}"
    )
    model.zero_grad(set_to_none=True)
    independent = allocator_peak(lambda: step(*batch)) + storage_bytes([*model.parameters(), *model.buffers(), *batch])
    assert step.plan.peak_memory // 2 < independent <= budget, f"the allocator read {independent}, budget {budget}"


@pytest.mark.slow
def test_smaller_budgets_never_measure_more() -> None:
    model, loss_fn, batch = _build("gpt")
    measured = []
    for budget in (1.0, 0.85, 0.7):
        step = _compile(model, loss_fn, batch, budget)
        model.zero_grad(set_to_none=True)
        step(*batch)
        measured.append(step.report().measured_peak)
    assert measured == sorted(measured, reverse=True), measured


@pytest.mark.slow
def test_a_budget_below_the_fused_graph_names_the_smallest() -> None:
    model, loss_fn, batch = _build("gpt")
    with pytest.raises(InfeasibleBudget) as error:
        _compile(model, loss_fn, batch, 1000)
    assert error.value.minimum is not None and error.value.minimum > 1000


def test_fused_capture_merges_pointwise_chains_only() -> None:
    """Fused capture joins only fusible nodes (no library kernel, no random op), never across the loss, and leaves
    every fusible node that several nodes read on its own: its value must be materialized for them."""
    model, loss_fn, batch = _build("gpt")
    ops = checkmate.capture(model, loss_fn, batch, cost_model="unit")
    fused = checkmate.capture(model, loss_fn, batch, cost_model="unit", fused=True)
    fx_nodes = {node.name: node for node in fused.module.graph.nodes}
    ops_loss = next(index for index, members in enumerate(ops.members) if ops.loss in members)
    merged = 0
    for members in fused.members:
        inner = [index for index, group in enumerate(ops.members) if set(group) <= set(members)]
        assert sum(len(ops.members[index]) for index in inner) == len(members), "a fused node splits an op's node"
        if len(inner) > 1:
            merged += 1
            assert all(fusible(ops.members[index], fx_nodes) for index in inner), f"{members} fuses a kernel call"
            assert len({index > ops_loss for index in inner}) == 1, f"{members} crosses the loss"
            assert not any(is_extern(fx_nodes[name]) for name in members)
    assert merged > 0 and fused.graph.size == ops.graph.size - sum(
        len([i for i, g in enumerate(ops.members) if set(g) <= set(m)]) - 1 for m in fused.members
    )


def test_an_unknown_executor_is_refused_before_any_work() -> None:
    model, loss_fn, batch = _build("gpt")
    with pytest.raises(InvalidArgument, match="executor"):
        checkmate.compile(model, loss_fn, batch, budget=1.0, executor="tvm")


@pytest.mark.slow
def test_a_second_compile_neither_measures_nor_solves(monkeypatch: pytest.MonkeyPatch) -> None:
    """Node measures and plans come from the disk caches the second time (Inductor keeps its own compile cache)."""
    model, loss_fn, batch = _build("gpt")
    first = _compile(model, loss_fn, batch, 0.8)
    solved: list[str] = []
    real_solve = checkmate.training.planning.solve

    def counting_solve(graph: Any, budget: Any, *, method: str, **options: Any) -> Any:
        solved.append(method)
        return real_solve(graph, budget, method=method, **options)

    def no_measuring(*arguments: Any) -> None:
        raise AssertionError("the node measures should come from the cache")

    monkeypatch.setattr(checkmate.training.planning, "solve", counting_solve)
    monkeypatch.setattr(checkmate.solving, "solve", counting_solve)
    monkeypatch.setattr(checkmate.inductor.measure, "_measure", no_measuring)
    second = _compile(model, loss_fn, batch, 0.8)
    assert solved and set(solved) == {"checkpoint_all"}, (
        "only each capture's no-recomputation reference is computed again, not its plan"
    )
    assert (second.plan.R == first.plan.R).all() and (second.plan.S == first.plan.S).all()
