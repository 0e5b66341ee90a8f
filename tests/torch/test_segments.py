"""Runs of a schedule fused into one Inductor call (`checkmate.inductor.segments`).

The end-to-end oracles (gradients against eager, the allocator within the plan, a recomputation not merged away) are
in `test_inductor.py`, whose steps run fused; here: which runs may be fused, that the measured peak decides, and that
a second compile measures nothing.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch

import checkmate
import checkmate.inductor.segments
from checkmate import zoo
from checkmate.execute.codegen import SegmentCall
from checkmate.inductor.kernels import GraphToCompile
from checkmate.inductor.segments import candidate_runs, split_position
from checkmate.simulate import Compute, Free

pytestmark = pytest.mark.usefixtures("module_cache_directory", "no_timing_choices")


def _every(step: Compute) -> bool:
    return True


def test_runs_stop_at_a_node_that_cannot_join() -> None:
    steps = [Compute(0, 0), Compute(1, 1), Free(0, 1), Compute(2, 2), Compute(3, 3), Compute(4, 4)]
    runs = candidate_runs(steps, lambda step: step.node != 2, max_nodes=10)
    assert runs == [range(0, 3), range(4, 6)]


def test_a_recomputation_never_joins_the_run_of_what_it_recomputes() -> None:
    steps = [Compute(0, 0), Compute(1, 1), Free(0, 1), Compute(0, 2), Compute(2, 2)]
    assert candidate_runs(steps, _every, max_nodes=10) == [range(0, 3), range(3, 5)]


def test_a_node_freed_in_a_run_is_not_computed_again_in_it() -> None:
    """Its Free would read as the end of the new copy (found on ResNet: gradients 4.5e-2 off eager)."""
    steps = [Compute(0, 0), Compute(1, 1), Compute(2, 2), Free(0, 2), Compute(0, 3), Compute(3, 3)]
    assert candidate_runs(steps, _every, max_nodes=10) == [range(0, 4), range(4, 6)]


def test_a_node_with_a_live_copy_is_not_computed_in_a_run() -> None:
    steps = [Compute(0, 0), Compute(1, 1), Compute(0, 1), Compute(2, 2)]
    assert candidate_runs(steps, _every, max_nodes=10) == [range(0, 2)]


def test_a_run_stops_before_freeing_one_of_several_copies() -> None:
    steps = [Compute(0, 0), Compute(1, 1), Compute(1, 2), Compute(2, 2), Compute(3, 3), Free(1, 3), Compute(4, 4)]
    runs = candidate_runs(steps, _every, max_nodes=10)
    assert runs == [range(0, 2), range(3, 5)], "node 1 holds two copies when stage 3 frees one"


def test_runs_are_at_most_max_nodes_long() -> None:
    steps = [Compute(node, node) for node in range(7)]
    assert candidate_runs(steps, _every, max_nodes=3) == [range(0, 3), range(3, 6)]


def _gpt_step() -> Any:
    torch.manual_seed(0)
    model, loss_fn, batch = zoo.gpt(batch_size=2, length=16, dim=32, heads=2, layers=1, vocab=64)
    step = checkmate.compile(
        model, loss_fn, batch, budget=1.0, executor="inductor", cost_model="flops", measure_memory="never"
    )
    step(*batch)
    return step, batch


@pytest.mark.slow
def test_a_run_is_fused_only_where_its_measured_peak_fits_the_plan(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Any
) -> None:
    step, _ = _gpt_step()
    compiled = step._compiled[step._current]
    calls = [item for item in compiled.program.lowered(compiled.schedule) if isinstance(item, SegmentCall)]
    assert calls, "a step without recomputation is one run of compiled nodes"
    assert sum(len(call.computes) for call in calls) > len(compiled.schedule.steps) // 3

    monkeypatch.setenv("CHECKMATE_CACHE_DIR", str(tmp_path))  # no cached peaks: every run is measured again
    monkeypatch.setattr(checkmate.inductor.segments, "measure_rise", lambda *arguments: 2**40)
    assert compiled.program.lowered(compiled.schedule) == compiled.schedule.steps, "no run fits when it measures 1 TiB"


@pytest.mark.slow
def test_a_second_compile_measures_no_run(monkeypatch: pytest.MonkeyPatch) -> None:
    _gpt_step()

    def no_measuring(*arguments: Any) -> None:
        raise AssertionError("the runs' peaks should come from the cache")

    monkeypatch.setattr(checkmate.inductor.segments, "measure_rise", no_measuring)
    step, _ = _gpt_step()
    compiled = step._compiled[step._current]
    assert any(isinstance(item, SegmentCall) for item in compiled.program.lowered(compiled.schedule))


@pytest.mark.slow
def test_the_predicted_time_counts_each_fused_call_as_measured() -> None:
    """With profiled costs the report predicts the step as it runs: each fused call at its own measured time, each
    other computation at its node's cost; the plan's own price (per node) is given beside it."""
    torch.manual_seed(0)
    model, loss_fn, batch = zoo.gpt(batch_size=2, length=16, dim=32, heads=2, layers=1, vocab=64)
    step = checkmate.compile(model, loss_fn, batch, budget=1.0, executor="inductor", measure_memory="never")
    step(*batch)
    compiled = step._compiled[step._current]
    steps = compiled.program.run_steps(compiled.schedule)
    calls = [item for item in steps if isinstance(item, SegmentCall)]
    assert calls and all(call.seconds > 0 for call in calls)
    graph = compiled.captured.graph
    alone = [item for item in steps if isinstance(item, Compute)]
    expected = sum(call.seconds for call in calls) + sum(float(graph.costs[item.node]) for item in alone)
    report = step.report()
    assert report.predicted_time == pytest.approx(expected)
    assert report.planned_time == step.plan.cost
    fused_nodes = sum(float(graph.costs[compute.node]) for call in calls for compute in call.computes)
    assert report.predicted_time != pytest.approx(report.planned_time), (
        f"the fused calls ({sum(call.seconds for call in calls):.6f} s) replace their nodes' costs "
        f"({fused_nodes:.6f} s)"
    )
    assert "as planned, before fusing runs" in str(report)


def test_a_run_known_not_to_fit_is_not_compiled_again(monkeypatch: pytest.MonkeyPatch, tmp_path: Any) -> None:
    """A run whose cached peak is above the plan's is split without compiling it (a second compile of the same model
    compiles only the runs it keeps)."""
    step, _ = _gpt_step()
    compiled = step._compiled[step._current]
    monkeypatch.setenv("CHECKMATE_CACHE_DIR", str(tmp_path))

    def one_tebibyte(entry: Any, arguments: list[Any], device: torch.device) -> int:
        arguments.clear()  # as the boxed call does
        return 2**40

    monkeypatch.setattr(checkmate.inductor.segments, "measure_rise", one_tebibyte)
    assert compiled.program.lowered(compiled.schedule) == compiled.schedule.steps

    def no_compiling(graphs: list[GraphToCompile], fx_nodes: Any) -> None:
        compiled = [graph.what for graph in graphs]
        raise AssertionError(f"{compiled} compiled again, measured above the plan's peak before")

    monkeypatch.setattr(checkmate.inductor.segments, "compile_graphs", no_compiling)
    assert compiled.program.lowered(compiled.schedule) == compiled.schedule.steps


def test_a_split_keeps_each_recomputation_priced_as_fused_with_its_readers() -> None:
    """Nodes 0-3 at stage 5; node 1 is read by node 3. The middle split (index 2) would leave node 1's recomputation,
    priced to run inside its reader's kernel, in another call than node 3: the split moves to index 1."""
    users = [(1,), (2, 3), (3,), (), (), ()]
    run = [(0, 5), (1, 5), (2, 5), (3, 5)]
    assert split_position(run, users, [False] * 6) == 2, "nothing priced as fused: the middle"
    fused = [False, True, False, False, False, False]
    assert split_position(run, users, fused) == 1
    assert split_position([(0, 0), (1, 1), (2, 2), (3, 3)], users, fused) == 2, "a first run: the middle"
    assert split_position([(1, 5), (3, 5)], users, fused) == 1, "every split separates it: the middle"
