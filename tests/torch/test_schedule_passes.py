"""The runtime seam: schedule passes applied in their stated order, and step kinds open to extension.

A new kind of schedule step is a class and its lowering (`emit_step.register`), with no edit to codegen; an unknown
kind is refused by name; passes run by `PassOrder` whatever order they are given in; a fused run never crosses a
call a distribution placed (`checkmate.inductor.segments`).
"""

from __future__ import annotations

import operator
from dataclasses import dataclass, field

import pytest
import torch

from checkmate.errors import ExecutionError
from checkmate.execute.codegen import (
    BODY,
    Call,
    NodeProgram,
    Operation,
    Reference,
    StepSource,
    StepWriter,
    emit_step,
    step_function,
)
from checkmate.execute.passes import Lowering, PassOrder, apply_passes, schedule_positions
from checkmate.inductor.segments import _cut
from checkmate.simulate import Compute, Free, Schedule


def _nodes() -> tuple[NodeProgram, ...]:
    """x = input * 2; loss = x.sum()."""
    double = Operation("x", operator.mul, operator.mul, (Reference("input_0"), 2.0), {}, ())
    total = Operation("loss", torch.sum, torch.sum, (Reference("x"),), {}, ())
    return (
        NodeProgram("graph node 0", (double,), exports=("x",)),
        NodeProgram("graph node 1", (total,), exports=(), loss="loss"),
    )


@dataclass(frozen=True)
class Record:
    """A step kind this test adds: hands the live value of `name` to `sink`."""

    name: str
    sink: list[torch.Tensor] = field(compare=False)


@emit_step.register(Record)
def _(step: Record, writer: StepWriter) -> None:
    writer.emit(f"{BODY}{writer.bind(step.sink.append, 'f')}({writer.variable(step.name)})")


def test_a_new_step_kind_is_a_class_and_its_lowering() -> None:
    seen: list[torch.Tensor] = []
    steps = (Compute(0, 0), Record("x", seen), Compute(1, 1), Free(0, 1), Free(1, 1))
    function = step_function(StepSource(_nodes(), ("input_0",), {}, 0, steps))
    loss, _, _ = function([torch.ones(3)], lambda index, gradient: None)
    assert float(loss) == 6.0
    assert len(seen) == 1 and torch.equal(seen[0], torch.full((3,), 2.0))


def test_a_step_kind_without_lowering_is_refused_by_name() -> None:
    @dataclass(frozen=True)
    class Unknown:
        node: int

    with pytest.raises(ExecutionError, match="no lowering for a schedule step of kind Unknown"):
        step_function(StepSource(_nodes(), ("input_0",), {}, 0, (Compute(0, 0), Unknown(0), Compute(1, 1))))


@dataclass(frozen=True)
class Mark:
    """A pass that appends a Call labelled `label` after the steps."""

    label: str
    order: PassOrder

    def __call__(self, lowering: Lowering) -> Lowering:
        return Lowering(lowering.schedule, (*lowering.steps, Call(self.label, lambda: None)), lowering.held, 0)


def test_passes_run_by_their_order_whatever_order_they_are_given_in() -> None:
    schedule = Schedule((Compute(0, 0), Compute(1, 1), Free(0, 1), Free(1, 1)), 2.0, 8, (4, 8))
    steps = apply_passes(schedule, [Mark("fuse", PassOrder.FUSE), Mark("place", PassOrder.PLACE)])
    labels = [step.label for step in steps if isinstance(step, Call)]
    assert labels == ["place", "fuse"]
    assert schedule_positions(steps) == (0, 1, 2, 3, None, None)


def test_a_fused_run_is_cut_where_a_call_was_placed() -> None:
    steps = [Compute(0, 0), Compute(1, 1), Compute(2, 2), Free(1, 2), Free(0, 2), Compute(3, 3), Compute(4, 4)]
    assert _cut(range(7), {2}, steps) == [range(2), range(2, 7)]
    assert _cut(range(7), {3}, steps) == [range(3), range(5, 7)], "a piece starts at its first Compute step"
    assert _cut(range(7), {0, 7, 12}, steps) == [range(7)], "a call at or outside the run's ends cuts nothing"
