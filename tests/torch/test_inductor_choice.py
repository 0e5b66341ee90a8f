"""The Inductor executor runs each node the faster way, and each run of the schedule fused only where that is faster.

`checkmate.inductor.choice`: a node whose ATen ops measure faster than its compiled function runs as ATen ops, priced
by that measure. `checkmate.inductor.segments`: a run whose fused call is slower than its steps one by one runs as
those steps. The measures are replaced here (which way is faster is then known); the oracles are the kernels chosen,
the steps the step runs, and gradients against plain `loss.backward()` with the allocator within the plan.
"""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Sequence
from typing import Any

import pytest
import torch
from eager_oracle import compare_steps
from torch import nn

import checkmate
import checkmate.inductor.choice
import checkmate.inductor.kernels
import checkmate.inductor.segments
from checkmate.captured import Captured
from checkmate.execute.codegen import SegmentCall
from checkmate.inductor.choice import faster_kernels
from checkmate.inductor.kernels import GraphToCompile, NodeKernel, compile_kernels
from checkmate.inductor.measure import KernelMeasure, measure_kernels
from checkmate.simulate import Compute
from checkmate.torch_capture import capture
from checkmate.torch_capture.fusion import convolution_call, fusible

pytestmark = pytest.mark.usefixtures("module_cache_directory")


def _model() -> tuple[nn.Module, tuple[torch.Tensor]]:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 64), nn.GELU(), nn.Linear(64, 64), nn.Tanh(), nn.Linear(64, 4))
    return model, (torch.randn(256, 16),)


def _loss(model: nn.Module, inputs: torch.Tensor) -> torch.Tensor:
    return model(inputs).square().mean()


def _aten_measured_as(seconds: dict[int, float], default: float, compiled: float | None = None) -> Any:
    """`measure_kernels` whose ATen measures take `seconds[node]` (else `default`), and Inductor's `compiled`
    seconds (None: as measured)."""

    def measured(
        captured: Captured, kernels: Sequence[NodeKernel], inputs: Sequence[Any], device: torch.device
    ) -> tuple[KernelMeasure, ...]:
        measures = measure_kernels(captured, kernels, inputs, device)
        return tuple(
            dataclasses.replace(measure, seconds=seconds.get(kernel.index, default))
            if kernel.key.endswith(":aten")
            else measure
            if compiled is None
            else dataclasses.replace(measure, seconds=compiled)
            for kernel, measure in zip(kernels, measures, strict=True)
        )

    return measured


def test_a_node_whose_aten_ops_are_faster_runs_as_them(monkeypatch: pytest.MonkeyPatch) -> None:
    model, batch = _model()
    captured = capture(model, _loss, batch, cost_model="flops", fused=True)
    kernels = compile_kernels(captured)
    fx_nodes = {node.name: node for node in captured.module.graph.nodes}
    library = [
        kernel.index for kernel in kernels if kernel.compiled and not fusible(captured.members[kernel.index], fx_nodes)
    ]
    target = library[0]
    monkeypatch.setattr(checkmate.inductor.choice, "measure_kernels", _aten_measured_as({target: 0.0}, 1.0, 0.5))
    inputs = [*(parameter.detach() for parameter in model.parameters()), *batch]
    chosen, measures = faster_kernels(captured, kernels, inputs, torch.device("cpu"))
    assert not chosen[target].compiled and chosen[target].function is kernels[target].module
    others = [index for index, kernel in enumerate(kernels) if kernel.compiled and index != target]
    assert others and all(chosen[index] is kernels[index] for index in others), "ATen ops slower, or fusible"
    assert measures[target].seconds == 0.0 and all(measures[index].seconds == 0.5 for index in others)


def test_a_node_that_is_one_convolution_is_not_compiled(monkeypatch: pytest.MonkeyPatch, tmp_path: Any) -> None:
    """Nodes that are one convolution (forward or backward) are never given to Inductor and run as their ATen ops,
    outside every fused run; every other node is compiled, and the step's gradients are eager's."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, 8, 3), nn.BatchNorm2d(8), nn.ReLU(), nn.Conv2d(8, 4, 3), nn.Flatten())
    batch = (torch.randn(4, 3, 12, 12),)
    captured = capture(model, _loss, batch, cost_model="flops", fused=True)
    fx_nodes = {node.name: node for node in captured.module.graph.nodes}
    given: list[str] = []
    compile_graphs = checkmate.inductor.kernels.compile_graphs

    def recording(graphs: Sequence[GraphToCompile], nodes: dict[str, torch.fx.Node]) -> Any:
        given.extend(graph.what for graph in graphs)
        return compile_graphs(graphs, nodes)

    monkeypatch.setattr(checkmate.inductor.kernels, "compile_graphs", recording)
    kernels = compile_kernels(captured)
    convolutions = {index for index, members in enumerate(captured.members) if convolution_call(members, fx_nodes)}
    assert len(convolutions) == 4, "two convolutions, forward and backward"
    assert all(
        not kernels[index].compiled and kernels[index].function is kernels[index].module for index in convolutions
    )
    assert not {f"planning node {index}" for index in convolutions} & set(given)
    assert all(kernel.compiled for kernel in kernels if kernel.index not in convolutions)
    monkeypatch.setenv("CHECKMATE_CACHE_DIR", str(tmp_path))  # no cached run times
    monkeypatch.setattr(checkmate.inductor.segments, "call_seconds", lambda *arguments: 0.0)  # every run pays
    reference = copy.deepcopy(model)
    step = checkmate.compile(model, _loss, batch, budget=1.0, executor="inductor", measure_memory="never")
    compiled = step._compiled[step._current]
    fx_nodes = {node.name: node for node in compiled.captured.module.graph.nodes}
    convolutions = {
        index for index, members in enumerate(compiled.captured.members) if convolution_call(members, fx_nodes)
    }
    calls = [item for item in compiled.program.run_steps(compiled.schedule) if isinstance(item, SegmentCall)]
    assert calls and not any(compute.node in convolutions for call in calls for compute in call.computes)
    compare_steps(step, reference, batch, seed=3, context="convolutions as ATen ops", exact=False)


def test_a_step_whose_library_nodes_are_faster_as_aten_ops_runs_them_with_eager_gradients(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Every ATen measure is faster: each node with a library kernel (the Linear layers) runs as ATen ops, outside
    every fused call, and the nodes Inductor fuses (GELU, Tanh, their gradients) stay compiled."""
    model, batch = _model()
    reference = copy.deepcopy(model)
    monkeypatch.setattr(checkmate.inductor.choice, "measure_kernels", _aten_measured_as({}, 0.0, compiled=1.0))
    step = checkmate.compile(model, _loss, batch, budget=0.7, executor="inductor", measure_memory="never")
    compiled = step._compiled[step._current]
    captured = compiled.captured
    fx_nodes = {node.name: node for node in captured.module.graph.nodes}
    library = {index for index, members in enumerate(captured.members) if not fusible(members, fx_nodes)}
    assert library and len(library) < captured.graph.size
    costs = captured.graph.costs
    assert all(costs[index] == 0.0 for index in library) and all(
        costs[index] == 1.0 for index in range(captured.graph.size) if index not in library
    ), "each node priced by the way it runs"
    calls = [item for item in compiled.program.run_steps(compiled.schedule) if isinstance(item, SegmentCall)]
    assert not any(compute.node in library for call in calls for compute in call.computes)
    assert step.plan.recomputes
    compare_steps(step, reference, batch, seed=3, context="library nodes as ATen ops", exact=False)


@pytest.mark.parametrize("fused_seconds", [0.0, 1.0])
def test_a_run_is_fused_only_where_its_call_is_faster_than_its_steps(
    fused_seconds: float, monkeypatch: pytest.MonkeyPatch, tmp_path: Any
) -> None:
    """A fused call that takes 1 s is slower than its steps one by one, so none is kept; one that takes no time is."""
    monkeypatch.setenv("CHECKMATE_CACHE_DIR", str(tmp_path))  # no cached run times
    monkeypatch.setattr(checkmate.inductor.segments, "call_seconds", lambda *arguments: fused_seconds)
    monkeypatch.setattr(checkmate.inductor.choice, "measure_kernels", _aten_measured_as({}, 1.0))  # all compiled
    model, batch = _model()
    reference = copy.deepcopy(model)
    step = checkmate.compile(model, _loss, batch, budget=1.0, executor="inductor", measure_memory="never")
    compiled = step._compiled[step._current]
    steps = compiled.program.run_steps(compiled.schedule)
    calls = [item for item in steps if isinstance(item, SegmentCall)]
    if fused_seconds:
        assert not calls and sum(isinstance(item, Compute) for item in steps) == len(compiled.captured.graph.nodes)
    else:
        assert calls
    compare_steps(step, reference, batch, seed=3, context=f"fused calls measured at {fused_seconds} s", exact=False)
