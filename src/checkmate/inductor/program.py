"""The executor's program for compiled nodes: each node is one call of its Inductor function and one `getitem` per
value it returns, so the generated step function (`checkmate.execute.codegen`) runs, frees, hands out and replays
values exactly as it does for ATen nodes. Random nodes keep their ATen operations. Before a schedule's function is
generated, runs of its steps become one compiled call each where they fit the plan (`checkmate.inductor.segments`)."""

from __future__ import annotations

import dataclasses
import operator
from collections.abc import Sequence

import torch
import torch.fx

from checkmate.captured import Captured
from checkmate.execute.codegen import NodeProgram, Operation, Reference
from checkmate.execute.program import Program, prepare
from checkmate.inductor.kernels import NodeKernel
from checkmate.inductor.segments import FuseRuns
from checkmate.torch_capture.strides import traced_stride


def inductor_program(captured: Captured, kernels: Sequence[NodeKernel], device: torch.device) -> Program:
    """The ATen program of `captured` with every compiled node's operations replaced by its function's call, and
    runs of each schedule compiled as one function (`checkmate.inductor.segments`) where they fit its plan."""
    aten = prepare(captured)
    fx_nodes = {node.name: node for node in captured.module.graph.nodes}
    nodes = tuple(
        _compiled_node(program, kernel, fx_nodes) if kernel.compiled else program
        for program, kernel in zip(aten.nodes, kernels, strict=True)
    )
    return dataclasses.replace(aten, nodes=nodes, step_functions={}).with_passes(
        FuseRuns(captured, tuple(kernels), device)
    )


def _compiled_node(program: NodeProgram, kernel: NodeKernel, fx_nodes: dict[str, torch.fx.Node]) -> NodeProgram:
    returned = f"kernel_{kernel.index}"
    call = Operation(
        name=returned,
        target=_Described(f"Inductor function of planning node {kernel.index}"),
        function=kernel.function,
        args=tuple(Reference(name) for name in kernel.inputs),
        kwargs={},
        release=(),
    )
    exported = set(program.exports)
    last = len(kernel.outputs) - 1
    unpack = tuple(
        Operation(
            name=name,
            target=operator.getitem,
            function=operator.getitem,
            args=(Reference(returned), position),
            kwargs={},
            release=((returned,) if position == last else ()) + (() if name in exported else (name,)),
            stride=traced_stride(fx_nodes[name]),
        )
        for position, name in enumerate(kernel.outputs)
    )
    return dataclasses.replace(program, operations=(call, *unpack))


@dataclasses.dataclass(frozen=True)
class _Described:
    """A call target shown in error messages by its description."""

    description: str

    def __str__(self) -> str:
        return self.description

    def __call__(self) -> None:
        raise TypeError(self.description)
