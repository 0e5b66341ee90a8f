"""Schedules run by `checkmate.execute.program` against eager autograd, on hand-made captures (make_fx, one group
of fx nodes per graph node).

The fixture here is deliberately independent of checkmate.capture: it groups each compute op with the views,
getitems and in-place ops applied to its result, which is all the executor's contract asks for. Its graph counts
tensor storages only (no kernel scratch, no saved generator states), so its peaks are read by the meter that counts
exactly those (`measure_peak` on ATen ops' outputs): it checks that the executor frees each value when the schedule
says. The CPU allocator's peak, which also sees scratch and generator states, is checked against plans of the same
net made by checkmate.capture (`test_recomputing_plans_hold_no_more_than_planned_on_the_allocator`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
import torch
from eager_oracle import measured_call
from torch import nn
from torch.fx.experimental.proxy_tensor import make_fx
from torch.utils import _pytree as pytree

import checkmate
from checkmate import Graph, Node, cheapest_r, lower, make_plan, solve
from checkmate.captured import Captured
from checkmate.errors import ExecutionError
from checkmate.execute import measure_peak, prepare, run_schedule, storage_bytes
from checkmate.simulate import Compute, Free, Schedule

VIEW_OPS = {"t", "view", "detach", "alias", "expand", "permute", "transpose", "unsqueeze", "squeeze", "_unsafe_view"}


class _Step(nn.Module):
    def __init__(self, model: nn.Module, loss_fn: Callable[..., torch.Tensor]) -> None:
        super().__init__()
        self.model = model
        self.loss_fn = loss_fn

    def forward(self, *batch: torch.Tensor) -> torch.Tensor:
        return self.loss_fn(self.model, *batch)


def _joins_argument(node: torch.fx.Node) -> bool:
    if node.target is __import__("operator").getitem:
        return True
    name = getattr(node.target, "__name__", "").split(".")[0]
    return name.endswith("_") or name in VIEW_OPS


def _value_bytes(value: Any) -> int:
    leaves = [v for v in pytree.tree_leaves(value) if isinstance(v, torch.Tensor)]
    return sum(v.numel() * v.element_size() for v in leaves)


def handmade_capture(model: nn.Module, loss_fn: Callable[..., torch.Tensor], batch: tuple[Any, ...]) -> Captured:
    """Trace `loss_fn(model, *batch)` and its gradients with make_fx and group it into a planning graph."""
    names = tuple(name for name, _ in model.named_parameters())
    leaves, spec = pytree.tree_flatten(tuple(batch))
    step = _Step(model, loss_fn)

    def joint(*flat: torch.Tensor) -> tuple[torch.Tensor, ...]:
        params = dict(zip(["model." + n for n in names], flat[: len(names)], strict=True))
        inputs = pytree.tree_unflatten(list(flat[len(names) :]), spec)
        loss = torch.func.functional_call(step, params, tuple(inputs))
        return (loss, *torch.autograd.grad(loss, flat[: len(names)]))

    params = [p.detach().requires_grad_() for p in model.parameters()]
    module = make_fx(joint, tracing_mode="fake")(*params, *leaves)
    output = next(n for n in module.graph.nodes if n.op == "output")
    loss_node, *gradient_nodes = output.args[0]
    group_of: dict[str, int] = {}
    groups: list[list[torch.fx.Node]] = []
    for node in module.graph.nodes:
        if node.op != "call_function":
            continue
        base = node.args[0] if node.args else None
        if _joins_argument(node) and isinstance(base, torch.fx.Node) and base.name in group_of:
            group_of[node.name] = group_of[base.name]
            groups[group_of[base.name]].append(node)
        else:
            group_of[node.name] = len(groups)
            groups.append([node])
    loss_group = group_of[loss_node.name]
    exports: list[list[str]] = [[] for _ in groups]
    inputs: list[set[int]] = [set() for _ in groups]
    for index, members in enumerate(groups):
        for member in members:
            for argument in member.all_input_nodes:
                source = group_of.get(argument.name)
                if source is not None and source != index:
                    inputs[index].add(source)
                    if argument.name not in exports[source]:
                        exports[source].append(argument.name)
    nodes = []
    for index, members in enumerate(groups):
        head = members[0]
        memory = 0 if _joins_argument(head) else _value_bytes(head.meta["val"])
        nodes.append(Node(head.name, 1.0, memory, index > loss_group, tuple(sorted(inputs[index]))))
    parameter_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    fixed = 2 * parameter_bytes + sum(_value_bytes(leaf) for leaf in leaves) + _value_bytes(loss_node.meta["val"])
    graph = Graph(tuple(nodes), fixed_memory=fixed)
    random = frozenset(i for i, members in enumerate(groups) if any("bernoulli" in str(m.target) for m in members))
    return Captured(
        graph=graph,
        module=module,
        members=tuple(tuple(m.name for m in members) for members in groups),
        exports=tuple(tuple(e) for e in exports),
        parameter_names=names,
        buffer_names=(),
        batch_shapes=tuple((tuple(leaf.shape), str(leaf.dtype).removeprefix("torch.")) for leaf in leaves),
        batch_spec=spec,
        loss=loss_node.name,
        gradients=tuple(g.name if isinstance(g, torch.fx.Node) else None for g in gradient_nodes),
        buffer_updates=(),
        random_nodes=random,
        cost_model="unit",
        device="cpu",
    )


class SkipNet(nn.Module):
    """An MLP with a skip connection and dropout."""

    def __init__(self) -> None:
        super().__init__()
        self.first = nn.Linear(6, 16)
        self.second = nn.Linear(16, 16)
        self.dropout = nn.Dropout(0.3)
        self.head = nn.Linear(16, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        hidden = torch.relu(self.first(x))
        hidden = hidden + self.dropout(torch.tanh(self.second(hidden)))
        return self.head(hidden)


def cross_entropy(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return nn.functional.cross_entropy(model(x), y)


@pytest.fixture(scope="module")
def setup() -> tuple[nn.Module, tuple[torch.Tensor, torch.Tensor], Captured]:
    torch.manual_seed(0)
    model = SkipNet()
    batch = (torch.randn(32, 6), torch.randint(0, 3, (32,)))
    return model, batch, handmade_capture(model, cross_entropy, batch)


def _eager(model: nn.Module, batch: tuple[torch.Tensor, ...], seed: int) -> tuple[torch.Tensor, list[torch.Tensor]]:
    torch.manual_seed(seed)
    model.zero_grad(set_to_none=True)
    loss = cross_entropy(model, *batch)
    loss.backward()
    return loss.detach(), [p.grad.clone() for p in model.parameters()]


def _executed(
    model: nn.Module, batch: tuple[torch.Tensor, ...], captured: Captured, R: np.ndarray, S: np.ndarray, seed: int
) -> tuple[torch.Tensor, list[torch.Tensor | None], int]:
    """Run the plan, adding each gradient into a zeroed buffer that exists before the step (as `.grad` does when it
    is set): every gradient is then held for the whole step, as the plan's fixed memory assumes."""
    return _executed_schedule(model, batch, captured, lower(captured.graph, R, S), seed)


def _executed_schedule(
    model: nn.Module, batch: tuple[torch.Tensor, ...], captured: Captured, schedule: Schedule, seed: int
) -> tuple[torch.Tensor, list[torch.Tensor | None], int]:
    params = [p.detach() for p in model.parameters()]
    gradients = [torch.zeros_like(p) for p in params]
    arrived: list[bool] = [False] * len(params)

    def sink(index: int, gradient: torch.Tensor) -> None:
        gradients[index].add_(gradient)
        arrived[index] = True

    torch.manual_seed(seed)
    with measure_peak(torch.device("cpu"), params + gradients + list(batch)) as meter:
        outputs = run_schedule(prepare(captured), schedule, [*params, *batch], on_gradient=sink)
    return outputs.loss, [g if ok else None for g, ok in zip(gradients, arrived, strict=True)], meter.peak_bytes


def _plans(graph: Graph) -> list[tuple[str, np.ndarray, np.ndarray]]:
    T = graph.size
    plans = []
    keep_all = solve(graph, None, method="checkpoint_all")
    plans.append(("checkpoint_all", keep_all.R, keep_all.S))
    nothing = np.zeros((T, T), dtype=bool)
    plans.append(("recompute_all", cheapest_r(graph, nothing), nothing))
    generator = np.random.default_rng(0)
    for draw in range(4):
        S = np.tril(generator.random((T, T)) < 0.15, -1)
        plans.append((f"random_{draw}", cheapest_r(graph, S), S))
    return plans


def test_every_plan_matches_eager_bitwise(setup: Any) -> None:
    model, batch, captured = setup
    model.train()
    expected_loss, expected_grads = _eager(model, batch, seed=7)
    expected_rng = torch.get_rng_state()
    for label, R, S in _plans(captured.graph):
        plan = make_plan(captured.graph, R, S, method=label)
        loss, gradients, peak = _executed(model, batch, captured, R, S, seed=7)
        assert torch.equal(loss, expected_loss), label
        for got, want in zip(gradients, expected_grads, strict=True):
            assert got is not None and torch.equal(got, want), label
        assert torch.equal(torch.get_rng_state(), expected_rng), f"{label}: the RNG stream advanced differently"
        assert peak <= plan.peak_memory, f"{label}: measured {peak} above planned {plan.peak_memory}"
        assert peak >= 0.9 * plan.peak_memory, f"{label}: measured {peak}, far below planned {plan.peak_memory}"


def test_dropout_node_is_replayed(setup: Any) -> None:
    _, _, captured = setup
    assert captured.random_nodes, "the fixture must contain a random node"
    T = captured.graph.size
    nothing = np.zeros((T, T), dtype=bool)
    R = cheapest_r(captured.graph, nothing)
    recomputed = R.sum(axis=0)
    assert all(recomputed[i] > 1 for i in captured.random_nodes)


def test_a_random_node_recomputed_while_its_first_copy_is_held(setup: Any) -> None:
    """Two live copies of the dropout node: the recomputed one (read by every consumer) replays the first one's mask,
    and holding it to the end of the step costs exactly its bytes on top of the plan's peak."""
    model, batch, captured = setup
    model.train()
    (random,) = captured.random_nodes
    keep_all = solve(captured.graph, None, method="checkpoint_all")
    schedule = lower(captured.graph, keep_all.R, keep_all.S)
    first = schedule.steps.index(Compute(random, random))
    steps = (*schedule.steps[: first + 1], Compute(random, random + 1), *schedule.steps[first + 1 :])
    twice = Schedule((*steps, Free(random, captured.graph.size - 1)), schedule.cost, schedule.peak_memory)
    expected_loss, expected_grads = _eager(model, batch, seed=11)
    expected_rng = torch.get_rng_state()
    _, _, peak = _executed_schedule(model, batch, captured, schedule, seed=11)
    loss, gradients, peak_twice = _executed_schedule(model, batch, captured, twice, seed=11)
    assert torch.equal(loss, expected_loss)
    for got, want in zip(gradients, expected_grads, strict=True):
        assert got is not None and torch.equal(got, want)
    assert torch.equal(torch.get_rng_state(), expected_rng)
    assert peak_twice == peak + captured.graph.nodes[random].memory


@pytest.mark.usefixtures("module_cache_directory")
def test_recomputing_plans_hold_no_more_than_planned_on_the_allocator() -> None:
    """The fixture's net and kinds of plans, captured by checkmate.capture with profiled scratch (each random node
    retains the generator state saved to replay it): the CPU allocator's peak of each step is within the plan's."""
    torch.manual_seed(0)
    model = SkipNet().train()
    batch = (torch.randn(32, 6), torch.randint(0, 3, (32,)))
    step = checkmate.compile(
        model, cross_entropy, batch, budget=1.0, method="checkpoint_all", cost_model="profile", measure_memory="never"
    )
    assert step.captured.random_nodes, "the net must contain a random node"
    above = {}
    for label, R, S in _plans(step.graph):
        plan = step.use_plan(make_plan(step.graph, R, S, method=label))
        _, measured = measured_call(step, batch)
        if measured > plan.peak_memory:
            above[label] = (measured, plan.peak_memory)
    assert not above, f"the allocator held more than planned, (measured, planned) by plan: {above}"


def test_a_schedule_is_generated_once_per_program() -> None:
    model = SkipNet()
    batch = (torch.randn(4, 6), torch.randint(0, 3, (4,)))
    captured = handmade_capture(model, cross_entropy, batch)
    program = prepare(captured)
    keep_all = solve(captured.graph, None, method="checkpoint_all")
    schedule = lower(captured.graph, keep_all.R, keep_all.S)
    assert program.step_function(schedule) is program.step_function(schedule)
    del schedule
    program.step_function(lower(captured.graph, keep_all.R, keep_all.S))
    assert len(program.step_functions) == 1, "the function of a schedule that is gone is dropped"


def test_failure_names_node_and_stage(setup: Any) -> None:
    model, batch, captured = setup
    keep_all = solve(captured.graph, None, method="checkpoint_all")
    schedule = lower(captured.graph, keep_all.R, keep_all.S)
    params = [p.detach() for p in model.parameters()]
    wrong = (torch.randn(32, 5), batch[1])
    with pytest.raises(ExecutionError, match=r"graph node \d+ .*stage \d+"):
        run_schedule(prepare(captured), schedule, [*params, *wrong], on_gradient=lambda i, g: None)


def test_input_count_is_checked(setup: Any) -> None:
    _, batch, captured = setup
    keep_all = solve(captured.graph, None, method="checkpoint_all")
    schedule = lower(captured.graph, keep_all.R, keep_all.S)
    with pytest.raises(ExecutionError, match="inputs"):
        run_schedule(prepare(captured), schedule, list(batch), on_gradient=lambda i, g: None)


def test_storage_bytes_counts_views_once() -> None:
    base = torch.zeros(10)
    assert storage_bytes([base, base[2:], base.view(2, 5)]) == 40
