"""Plans run by Inductor's fused kernels (`checkmate.compile(..., executor="inductor")`).

    captured = capture(model, loss_fn, batch, fused=True)       # one planning node per fused kernel
    step = prepare_inductor(captured, inputs, device=device, reprice_costs=True)
    plan = solve(step.captured.graph, budget)                   # priced by the compiled nodes as measured
    run_schedule(step.program, schedule_of(step.captured.graph, plan), inputs, on_gradient=...)

Stages: `kernels` compiles each planning node into one Inductor function (recomputations stay separate calls);
`measure` times them and reads the allocator around each call; `choice` keeps a node's ATen ops where they are
faster; `memory_traffic` times moving a value through memory; `pricing` puts those figures into the planning graph
(a recomputation fused into its reader's kernel costs less than its first run); `program` makes the executor's
program call the functions; `segments` compiles runs of a solved schedule as one function each (fusion across
nodes), keeping those that measure within the plan's peak and faster than their steps one by one.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from checkmate.captured import Captured
from checkmate.execute.program import Program
from checkmate.inductor.choice import faster_kernels
from checkmate.inductor.kernels import NodeKernel, compile_kernels
from checkmate.inductor.memory_traffic import memory_traffic
from checkmate.inductor.pricing import priced_graph
from checkmate.inductor.program import inductor_program


@dataclass(frozen=True)
class InductorStep:
    """A captured step whose nodes run as Inductor functions.

    Attributes:
        captured: the capture, its graph priced by the compiled nodes (memory and workspace always; costs when
            repriced, with cost_model "profile").
        program: the executor's program calling the compiled functions.
        kernels: each node's function.
    """

    captured: Captured
    program: Program
    kernels: tuple[NodeKernel, ...]


def prepare_inductor(
    captured: Captured, inputs: Sequence[Any], *, device: torch.device, reprice_costs: bool
) -> InductorStep:
    """Compile and measure every node of `captured` (inputs: parameters, buffers, batch in placeholder order)."""
    kernels, measures = faster_kernels(captured, compile_kernels(captured), inputs, device)
    traffic = memory_traffic(device) if reprice_costs else None
    graph = priced_graph(captured, kernels, measures, traffic=traffic)
    priced = dataclasses.replace(captured, graph=graph, cost_model="profile" if reprice_costs else captured.cost_model)
    return InductorStep(priced, inductor_program(priced, kernels, device), kernels)


__all__ = ["InductorStep", "NodeKernel", "prepare_inductor"]
