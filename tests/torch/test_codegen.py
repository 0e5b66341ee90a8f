"""Generated step functions on hand-made node programs: order, lifetimes, taken values, replays and failures.

The operations here are plain Python functions over small tensors, so each test can say exactly which values a
schedule keeps alive at each point (through weak references) and what it hands over.
"""

from __future__ import annotations

import math
import operator
import weakref
from collections.abc import Callable
from typing import Any

import pytest
import torch

from checkmate.errors import ExecutionError
from checkmate.execute.codegen import NodeProgram, Operation, Reference, StepSource, step_function
from checkmate.simulate import Compute, Free, Step


def _operation(name: str, function: Callable[..., Any], *args: Any, release: tuple[str, ...] = ()) -> Operation:
    return Operation(name, function, function, args, {}, release)


class Maker:
    """Makes a new tensor on each call, numbered, and remembers a weak reference to each one."""

    def __init__(self) -> None:
        self.made: list[weakref.ref[torch.Tensor]] = []

    def __call__(self) -> torch.Tensor:
        value = torch.tensor([float(len(self.made))])
        self.made.append(weakref.ref(value))
        return value

    def alive(self) -> list[int]:
        return [number for number, reference in enumerate(self.made) if reference() is not None]


class Probe:
    """Records, at each call, which of the maker's tensors are alive and which one it was given."""

    def __init__(self, maker: Maker) -> None:
        self.maker = maker
        self.seen: list[tuple[list[int], float]] = []

    def __call__(self, value: torch.Tensor) -> torch.Tensor:
        self.seen.append((self.maker.alive(), float(value)))
        return value.sum()


def _run(nodes: tuple[NodeProgram, ...], steps: list[Step], inputs: tuple[Any, ...] = (), buffer_count: int = 0) -> Any:
    """Generate and run the step; returns the loss, the buffer updates and the (index, gradient) handed over."""
    placeholders = tuple(f"input_{number}" for number in range(len(inputs)))
    function = step_function(StepSource(nodes, placeholders, {}, buffer_count, tuple(steps)))
    gradients: list[tuple[int, Any]] = []
    loss, updates, _ = function(inputs, lambda index, gradient: gradients.append((index, gradient)))
    return loss, updates, gradients


def test_values_arrive_in_order_and_die_after_their_last_use() -> None:
    maker = Maker()
    probe = Probe(maker)
    nodes = (
        NodeProgram(
            "graph node 0",
            (
                _operation("first", maker),
                _operation("second", maker),
                _operation("total", operator.add, Reference("first"), Reference("second"), release=("first",)),
                _operation("seen", probe, Reference("total"), release=("second", "total")),
            ),
            exports=("seen",),
        ),
        NodeProgram("graph node 1", (_operation("loss", probe, Reference("seen")),), exports=(), loss="loss"),
    )
    loss, _, _ = _run(nodes, [Compute(0, 0), Compute(1, 1), Free(0, 1), Free(1, 1)])
    assert probe.seen[0] == ([1], 1.0), "`first` died after its last use; `second` is still alive"
    assert probe.seen[1] == ([], 1.0), "no member of node 0 outlives it but its export"
    assert float(loss) == 1.0 and maker.alive() == []


def _copies_program(maker: Maker, probe: Probe) -> tuple[NodeProgram, ...]:
    return (
        NodeProgram("graph node 0 ('made')", (_operation("made", maker),), exports=("made",)),
        NodeProgram("graph node 1 ('probe')", (_operation("probe", probe, Reference("made")),), exports=("probe",)),
        NodeProgram("graph node 2 ('loss')", (_operation("loss", torch.neg, Reference("probe")),), (), loss="loss"),
    )


def test_a_node_computed_again_while_held_keeps_both_copies_and_free_drops_the_oldest() -> None:
    maker = Maker()
    probe = Probe(maker)
    steps: list[Step] = [
        Compute(0, 0),
        Compute(1, 1),  # one copy of node 0: made #0
        Free(1, 1),
        Compute(0, 1),  # a second copy while the first is held
        Compute(1, 1),  # both alive; consumers read the newest (#1)
        Free(1, 1),
        Free(0, 1),  # drops the oldest copy (#0)
        Compute(1, 1),  # only #1 is left
        Free(0, 1),
        Compute(2, 2),
        Free(1, 2),
        Free(2, 2),
    ]
    loss, _, _ = _run(_copies_program(maker, probe), steps)
    assert probe.seen == [([0], 0.0), ([0, 1], 1.0), ([1], 1.0)]
    assert float(loss) == -1.0 and maker.alive() == []


def test_freeing_a_node_without_a_live_copy_or_never_making_the_loss_is_refused() -> None:
    maker = Maker()
    nodes = _copies_program(maker, Probe(maker))
    with pytest.raises(ExecutionError, match=r"frees graph node 0 \('made'\) in stage 0, which holds no live copy"):
        _run(nodes, [Compute(0, 0), Free(0, 0), Free(0, 0)])
    with pytest.raises(ExecutionError, match="never computed the loss"):
        _run(nodes, [Compute(0, 0), Compute(1, 1), Free(0, 1), Free(1, 1)])


def _taking_program() -> tuple[NodeProgram, ...]:
    """Node 0 makes the loss (exported) and a gradient of parameter 1; node 1 a buffer update (exported)."""
    return (
        NodeProgram(
            "graph node 0",
            (
                _operation("loss", torch.mul, Reference("input_0"), 2.0),
                _operation("gradient", torch.add, Reference("loss"), 1.0, release=("gradient",)),
            ),
            exports=("loss",),
            loss="loss",
            gradients=((1, "gradient"),),
        ),
        NodeProgram(
            "graph node 1",
            (
                _operation("update", torch.sub, Reference("input_0"), 1.0),
                _operation("reads", torch.add, Reference("loss"), Reference("update")),
            ),
            exports=("update", "reads"),
            buffer_updates=((0, "update"),),
        ),
        NodeProgram("graph node 2", (_operation("after", torch.neg, Reference("update")),), exports=("after",)),
    )


def test_step_outputs_are_taken_once_and_a_recomputation_shares_the_first_ones() -> None:
    x = torch.tensor([3.0])
    steps: list[Step] = [Compute(0, 0), Compute(1, 1), Free(0, 1), Free(1, 1)]
    steps += [Compute(0, 2), Compute(1, 2), Compute(2, 2), Free(0, 2), Free(1, 2), Free(2, 2)]
    loss, updates, gradients = _run(_taking_program(), steps, (x,), buffer_count=2)
    assert torch.equal(loss, torch.tensor([6.0])) and not loss.requires_grad
    assert [(index, float(gradient)) for index, gradient in gradients] == [(1, 7.0)], "taken on the first run only"
    assert updates[1] is None and torch.equal(updates[0], torch.tensor([2.0]))


def test_a_recomputed_export_of_a_step_output_is_the_first_runs_tensor() -> None:
    x = torch.tensor([3.0])
    seen: list[torch.Tensor] = []

    def keep(value: torch.Tensor) -> torch.Tensor:
        seen.append(value)
        return value

    nodes = (*_taking_program()[:2], NodeProgram("graph node 2", (_operation("kept", keep, Reference("update")),), ()))
    steps: list[Step] = [Compute(0, 0), Compute(1, 1), Free(1, 1), Compute(1, 2), Compute(2, 2)]
    steps += [Free(0, 2), Free(1, 2), Free(2, 2)]
    _, updates, _ = _run(nodes, steps, (x,), buffer_count=1)
    assert seen[0] is updates[0], "the recomputed update was swapped for the first run's tensor"


def _random_program(draws: list[torch.Tensor]) -> tuple[NodeProgram, ...]:
    def draw(size: int) -> torch.Tensor:
        value = torch.rand(size)
        draws.append(value)
        return value

    return (
        NodeProgram("graph node 0 ('mask')", (_operation("mask", draw, 4),), exports=("mask",), random=True),
        NodeProgram("graph node 1 ('loss')", (_operation("loss", torch.sum, Reference("mask")),), (), loss="loss"),
    )


def test_a_recomputed_random_node_replays_its_draws_and_the_stream_advances_once() -> None:
    draws: list[torch.Tensor] = []
    steps: list[Step] = [Compute(0, 0), Compute(0, 1), Compute(1, 1), Free(0, 1), Free(0, 1), Free(1, 1)]
    torch.manual_seed(3)
    expected_mask = torch.rand(4)
    expected_state = torch.get_rng_state()
    torch.manual_seed(3)
    loss, _, _ = _run(_random_program(draws), steps)
    assert len(draws) == 2 and all(torch.equal(mask, expected_mask) for mask in draws)
    assert torch.equal(loss, expected_mask.sum())
    assert torch.equal(torch.get_rng_state(), expected_state)


def test_a_failure_names_the_node_the_stage_and_the_fx_node_also_inside_a_replay() -> None:
    calls: list[int] = []

    def fails_the_second_time(size: int) -> torch.Tensor:
        calls.append(size)
        if len(calls) == 2:
            raise RuntimeError("boom")
        return torch.rand(size)

    nodes = (
        NodeProgram("graph node 0 ('mask')", (_operation("mask", fails_the_second_time, 4),), ("mask",), random=True),
        NodeProgram("graph node 1 ('loss')", (_operation("loss", torch.sum, Reference("mask")),), (), loss="loss"),
    )
    steps: list[Step] = [Compute(0, 0), Compute(1, 1), Free(0, 1), Compute(0, 1), Free(0, 1), Free(1, 1)]
    torch.manual_seed(5)
    torch.rand(4)
    after_one_draw = torch.get_rng_state()
    torch.manual_seed(5)
    with pytest.raises(ExecutionError, match=r"graph node 0 \('mask'\), stage 1: fx node 'mask' .* failed: boom"):
        _run(nodes, steps)
    assert torch.equal(torch.get_rng_state(), after_one_draw), "the failed replay left the stream as it found it"


def test_arguments_render_containers_and_bind_constants() -> None:
    def join(items: list[Any], *, scale: float, extra: tuple[Any, ...] = ()) -> torch.Tensor:
        return torch.tensor([scale * float(item) for item in items] + [float(item) for item in extra])

    operation = Operation(
        "loss",
        join,
        join,
        ([Reference("input_0"), math.inf, -0.0],),
        {"scale": 2.0, "extra": (Reference("input_0"), float("nan"))},
        (),
    )
    loss, _, _ = _run((NodeProgram("graph node 0", (operation,), (), loss="loss"),), [Compute(0, 0)], (1.5,))
    assert loss[:4].tolist() == [3.0, math.inf, -0.0, 1.5] and math.isnan(loss[4])
