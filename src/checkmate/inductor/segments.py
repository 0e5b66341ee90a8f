"""Runs of a schedule's steps compiled as one Inductor function each, so that Inductor fuses across planning nodes.

One function per planning node (`checkmate.inductor.kernels`) keeps the plan's semantics but stops fusion at every
node boundary: a residual sum and the LayerNorm that reads it, a gradient and the sum into its neighbour's. Once a
plan is solved, this module compiles stretches of its schedule as one function each, as `torch.compile` compiles a
whole forward or backward.

A run is a stretch of consecutive steps in which

* every node computed has a compiled function (not random, not a library call, not run as ATen ops), is computed once,
  holds no live copy when the run computes it, and was not freed earlier in the run: a recomputation and the value it
  recomputes are never in one graph, so no common-subexpression elimination can merge them, and each Free in the run is
  either of a node the run computed (its values stay inside the call) or of one it did not (they die inside it);
* no recomputation makes the loss or a buffer update (the executor swaps the first run's tensors in for those);
* every node freed that the run did not compute holds exactly one live copy, which then dies inside the call;
* at most MAX_NODES nodes are computed.

Memory is measured, not assumed: Inductor reorders and fuses inside a run, so the per-node figures the plan was solved
with do not bound it. Each run's function is called once on zeros of the traced layouts, as the step calls it (the
values of freed nodes held only by the argument list, which the call empties), and the allocator's peak above the start
of the call is read. A run is kept when what the plan holds as it starts plus that rise stays within the plan's peak;
otherwise it is split in two and each half tried, down to single nodes, which run their own functions. A split falls at
the computation nearest the middle that keeps each recomputation priced as fused (`Node.recompute_cost`: it was priced
to run inside its reader's kernel) in the half of its readers (`split_position`); at the middle when no such computation
exists. Each kept run's call is then timed (the median of `TIMED_CALLS` calls on the same zeros), for the step's
predicted time as it runs (`checkmate.execute.predicted_time`); where the plan is priced by measurement, a run whose
call is clearly slower than its computations one by one (the sum of their measured costs) is not kept, and its steps run
one by one. The rises and times are cached on disk beside the node measures, so a second compile of the same model
measures nothing.
"""

from __future__ import annotations

import hashlib
import itertools
import logging
import statistics
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from checkmate.captured import Captured
from checkmate.execute.codegen import ScheduleItem, SegmentCall
from checkmate.execute.memory import measure_peak, synchronize
from checkmate.execute.passes import Lowering, PassOrder, schedule_positions, with_steps
from checkmate.inductor.choice import saves_enough
from checkmate.inductor.kernels import (
    GraphToCompile,
    NodeKernel,
    boxed_entry,
    compile_graphs,
    example_value,
    leaving_values,
    subgraph,
)
from checkmate.json_cache import finite_number, merge_entries, read_entries
from checkmate.simulate import Compute, Free, Step
from checkmate.stage_times import Stage, timed
from checkmate.torch_capture.profile import cache_directory, device_key

log = logging.getLogger(__name__)

MAX_NODES = 96
TIMED_CALLS = 3


def split_position(
    computes: Sequence[tuple[int, int]], users: Sequence[Sequence[int]], priced_as_fused: Sequence[bool]
) -> int:
    """Where a run of computations `computes` ((node, stage) each, in order) is split in two: the index, in 1 ..
    len - 1, of the first computation of the second half, the one nearest the middle (the earlier on a tie) that
    leaves no recomputation of a node `priced_as_fused` in another half than a reader of it in the run (`users`:
    each node's readers); the middle when every index separates one."""
    last_reader: list[int] = []
    for index, (node, stage) in enumerate(computes):
        readers = set(users[node])
        fused = priced_as_fused[node] and stage != node
        later = [after for after in range(index + 1, len(computes)) if computes[after][0] in readers]
        last_reader.append(max(later) if fused and later else index)
    middle = len(computes) // 2
    keeping = [
        split
        for split in range(1, len(computes))
        if not any(index < split <= last for index, last in enumerate(last_reader))
    ]
    return min(keeping, key=lambda split: (abs(split - middle), split)) if keeping else middle


def candidate_runs(steps: Sequence[Step], compiled: Callable[[Compute], bool], max_nodes: int) -> list[range]:
    """Positions of the runs of `steps` that may be one call (the rules in the module docstring), each computing at
    least two nodes; `compiled(step)` says whether a Compute step may join a run."""
    runs: list[range] = []
    copies: Counter[int] = Counter()
    start: int | None = None
    members: set[int] = set()

    def close(stop: int) -> None:
        if start is not None and len(members) >= 2:
            runs.append(range(start, stop))

    touched: set[int] = set()  # nodes the run computes or frees: a node it freed is not computed again in it
    for position, step in enumerate(steps):
        if isinstance(step, Compute):
            joinable = compiled(step) and copies[step.node] == 0
            if start is not None and (not joinable or step.node in touched or len(members) == max_nodes):
                close(position)
                start = None
            if joinable and start is None:
                start, members, touched = position, set(), set()
            if start is not None:
                members.add(step.node)
                touched.add(step.node)
            copies[step.node] += 1
        else:
            if start is not None and step.node not in members and copies[step.node] != 1:
                close(position)
                start = None
            if start is not None:
                touched.add(step.node)
            copies[step.node] -= 1
    close(len(steps))
    return runs


@dataclass(frozen=True)
class _RunGraph:
    """A run of the schedule as one graph to compile: what the plan holds as it starts (`before`), its computations,
    the nodes it computes and frees, those it frees without computing them, the fx values that die in it, and the key
    of its cached peak rise and time."""

    graph: GraphToCompile
    before: int
    computes: tuple[Compute, ...]
    freed: frozenset[int]
    handed: frozenset[int]
    dying: frozenset[str]
    rise_key: str


@dataclass(frozen=True)
class FuseRuns:
    """The Inductor executor's schedule pass (`checkmate.execute.passes`, order FUSE): each run of the steps between
    the calls placed before it that fits the plan is replaced by one compiled call."""

    captured: Captured
    kernels: tuple[NodeKernel, ...]
    device: torch.device
    order: PassOrder = PassOrder.FUSE

    def __call__(self, lowering: Lowering) -> Lowering:
        return with_steps(lowering, fused_steps(self.captured, self.kernels, self.device, lowering))


def fused_steps(
    captured: Captured, kernels: Sequence[NodeKernel], device: torch.device, lowering: Lowering
) -> tuple[ScheduleItem, ...]:
    """`lowering.steps` with each run that fits the plan's peak replaced by one compiled call; a run never crosses
    an item an earlier pass placed."""
    with timed(Stage.FUSED_RUNS):
        return _fused_steps(captured, kernels, device, lowering)


def _fused_steps(
    captured: Captured, kernels: Sequence[NodeKernel], device: torch.device, lowering: Lowering
) -> tuple[ScheduleItem, ...]:
    schedule = lowering.schedule
    positions = schedule_positions(lowering.steps)
    barriers = {
        following for placed, following in itertools.pairwise(positions) if placed is None and following is not None
    }
    runs = [
        piece
        for run in candidate_runs(schedule.steps, _joinable(captured, kernels), MAX_NODES)
        for piece in _cut(run, barriers, schedule.steps)
    ]
    if not runs:
        return lowering.steps
    fuser = _Fuser(captured, device, lowering)
    calls = {start: (call, stop) for start, stop, call in fuser.fuse(runs)}
    fuser.store()
    steps: list[ScheduleItem] = []
    stop = 0  # the schedule position the last call replaced steps up to
    for item, position in zip(lowering.steps, positions, strict=True):
        if position is not None and position < stop:
            continue
        if position in calls:
            call, stop = calls[position]
            steps.append(call)
        else:
            steps.append(item)
    log.info(
        "Inductor: %d of %d computations run in %d fused calls",
        sum(len(call.computes) for call, _ in calls.values()),
        sum(isinstance(step, Compute) for step in schedule.steps),
        len(calls),
    )
    return tuple(steps)


def _cut(run: range, barriers: set[int], steps: Sequence[Step]) -> list[range]:
    """`run` cut before each of `barriers` inside it, each piece from its first Compute step (a piece of a run is a
    run, see the module doc; the Free steps before its first Compute run as they are)."""
    cuts = [run.start, *sorted(position for position in barriers if run.start < position < run.stop), run.stop]
    pieces = []
    for start, stop in itertools.pairwise(cuts):
        while start < stop and not isinstance(steps[start], Compute):
            start += 1
        pieces.append(range(start, stop))
    return pieces


def _joinable(captured: Captured, kernels: Sequence[NodeKernel]) -> Callable[[Compute], bool]:
    leaving = {captured.loss, *filter(None, captured.buffer_updates), *captured.region_outputs}
    makes_leaving = {index for index, members in enumerate(captured.members) if leaving.intersection(members)}

    def joinable(step: Compute) -> bool:
        return kernels[step.node].compiled and (step.stage == step.node or step.node not in makes_leaving)

    return joinable


def measure_rise(entry: Callable[[list[Any]], Any], arguments: list[Any], device: torch.device) -> int:
    """The allocator's peak above its level when `entry(arguments)` starts (the executor's meter, `measure_peak`)."""
    with torch.no_grad(), measure_peak(device, (), allocator=True) as meter:
        entry(arguments)
    return meter.peak_bytes


def call_seconds(entry: Callable[[list[Any]], Any], arguments: list[Any], device: torch.device) -> float:
    """The median time of `TIMED_CALLS` calls of `entry` on `arguments` (held here, so none dies inside a call)."""
    times = []
    with torch.no_grad():
        for _ in range(TIMED_CALLS):
            synchronize(device)
            started = time.perf_counter()
            entry(list(arguments))
            synchronize(device)
            times.append(time.perf_counter() - started)
    return statistics.median(times)


class _Fuser:
    """Compiles and measures runs of one schedule, splitting those that would exceed the plan's peak."""

    def __init__(self, captured: Captured, device: torch.device, lowering: Lowering) -> None:
        schedule = lowering.schedule
        self.captured = captured
        self.device = device
        self.schedule = schedule
        self.peak = lowering.peak
        self.fx_nodes = {node.name: node for node in captured.module.graph.nodes}
        self.leaving = leaving_values(captured)
        self.priced_as_fused = [node.recompute_cost is not None for node in captured.graph.nodes]
        device_name = device_key(device, torch.get_num_threads())
        self.path = cache_directory() / f"inductor-runs-{device_name}.json"
        self.times_path = cache_directory() / f"inductor-run-times-{device_name}.json"
        self.rises: dict[str, int] = {key: int(value) for key, value in read_entries(self.path, finite_number).items()}
        self.times = {key: float(value) for key, value in read_entries(self.times_path, finite_number).items()}
        self.fresh_rises: dict[str, int] = {}
        self.fresh_times: dict[str, float] = {}
        # Bytes held just before each Compute step: its `usage` (`checkmate.simulate.lower`) less what the step adds.
        computes = [(position, step) for position, step in enumerate(schedule.steps) if isinstance(step, Compute)]
        self.before: dict[int, int] = {}
        # What is held beside the plan's own accounting at each Compute step (a distribution's calls).
        self.held = {position: held for (position, _), held in zip(computes, lowering.held, strict=True)}
        for (position, step), usage in zip(computes, schedule.usage, strict=True):
            first = step.stage == step.node
            node = captured.graph.nodes[step.node]
            transient = node.workspace if first or node.recompute_workspace is None else node.recompute_workspace
            self.before[position] = usage - node.memory - transient - (node.retained if first else 0)

    def fuse(self, runs: Sequence[range]) -> list[tuple[int, int, SegmentCall]]:
        """(start, stop, call) for `runs`: one call each, or those of its halves (single nodes stay steps). The runs
        are compiled a round at a time (the runs, then the halves of those that did not fit, ...), so that the
        kernels of a round build together (`checkmate.inductor.kernel_builds`)."""
        fused: list[tuple[int, int, SegmentCall]] = []
        pending = [run for run in runs if len(self._computes(run)) >= 2]
        started, round_number = time.perf_counter(), 0
        while pending:
            round_number += 1
            prepared = [(run, self._graph(run)) for run in pending]
            graphs = [graph for _, graph in prepared if graph is not None]
            functions = iter(compile_graphs([graph.graph for graph in graphs], self.fx_nodes) if graphs else [])
            halves: list[range] = []
            for run, graph in prepared:
                call = None if graph is None else self._call(graph, next(functions))
                if call is not None and not self._slower_than_alone(call):
                    fused.append((run.start, run.stop, call))
                elif call is None:
                    halves.extend(half for half in self._halves(run) if len(self._computes(half)) >= 2)
            log.info(
                "Inductor: round %d, %d runs of the schedule compiled and measured (%.0f s so far)",
                round_number,
                len(pending),
                time.perf_counter() - started,
            )
            pending = halves
        return fused

    def _computes(self, run: range) -> list[int]:
        return [position for position in run if isinstance(self.schedule.steps[position], Compute)]

    def _halves(self, run: range) -> tuple[range, range]:
        computes = self._computes(run)
        pairs = [
            (step.node, step.stage)
            for step in (self.schedule.steps[position] for position in computes)
            if isinstance(step, Compute)
        ]
        middle = computes[split_position(pairs, self.captured.graph.users, self.priced_as_fused)]
        return range(run.start, middle), range(middle, run.stop)

    def _slower_than_alone(self, call: SegmentCall) -> bool:
        """Whether `call` takes clearly longer than its computations as single calls (`choice.saves_enough`), where the
        plan's costs are measured seconds (each computation at its node's cost: a recomputation alone is a call of its
        own)."""
        if self.captured.cost_model != "profile":
            return False
        alone = sum(self.captured.graph.nodes[step.node].cost for step in call.computes)
        if not saves_enough(alone, call.seconds):
            return False
        log.info(
            "%s: %.2f ms, slower than its steps one by one (%.2f ms): not fused",
            call.label,
            1e3 * call.seconds,
            1e3 * alone,
        )
        return True

    def _graph(self, run: range) -> _RunGraph | None:
        """The graph of `run` as one call, or None where it cannot fit the plan's peak: what the plan holds as it
        starts is above it, or the call was measured above it before (then it is not compiled again)."""
        held = max(self.held.get(position, 0) for position in run)
        before = self.before[run.start] + held
        if before > self.peak:
            return None
        steps = [self.schedule.steps[position] for position in run]
        computes = tuple(step for step in steps if isinstance(step, Compute))
        members = {step.node for step in computes}
        freed = frozenset(step.node for step in steps if isinstance(step, Free) and step.node in members)
        handed = frozenset(step.node for step in steps if isinstance(step, Free) and step.node not in members)
        returned = {name for index in members - freed for name in self.captured.exports[index]}
        returned |= {
            name
            for step in computes
            if step.stage == step.node
            for name in self.captured.members[step.node]
            if name in self.leaving
        }
        fx_members = [name for step in computes for name in self.captured.members[step.node]]
        module, inputs, outputs, key = subgraph(self.fx_nodes, fx_members, frozenset(returned))
        label = f"fused run of steps {run.start}-{run.stop - 1} (nodes {computes[0].node}-{computes[-1].node})"
        dying = frozenset(name for index in handed for name in self.captured.exports[index])
        digest = hashlib.sha1(f"{key}|{sorted(inputs.index(name) for name in dying if name in inputs)}".encode())
        rise_key = digest.hexdigest()
        if rise_key in self.rises and before + self.rises[rise_key] > self.peak:
            log.debug("%s: measured %s above the plan's peak before; split", label, self.rises[rise_key])
            return None
        graph = GraphToCompile(key, module, inputs, outputs, label)
        return _RunGraph(graph, before, computes, freed, handed, dying, rise_key)

    def _call(self, run: _RunGraph, function: Callable[..., Any] | None) -> SegmentCall | None:
        """The run's call with Inductor's `function` for its graph, or None where it has none or its measured peak is
        above the plan's."""
        graph = run.graph
        entry = None if function is None else boxed_entry(function)
        if entry is None:
            return None
        measured = self._measured(entry, graph.inputs, run.dying, run.rise_key)
        if measured is None or run.before + measured[0] > self.peak:
            log.debug("%s: %s above the plan's peak; split", graph.what, measured)
            return None
        return SegmentCall(
            graph.what, entry, run.computes, graph.inputs, graph.outputs, run.freed, run.handed, measured[1]
        )

    def _measured(
        self, entry: Callable[[list[Any]], Any], inputs: Sequence[str], dying: frozenset[str], cache_key: str
    ) -> tuple[int, float] | None:
        """The allocator's peak above its level when the call starts, and the call's median time (None: the call
        kept its argument list), from the caches by `cache_key` (the run's graph and which of its arguments die in
        it) when measured before."""
        if cache_key in self.rises and cache_key in self.times:
            return self.rises[cache_key], self.times[cache_key]
        arguments = [example_value(self.fx_nodes[name]) for name in inputs]
        kept = [value for name, value in zip(inputs, arguments, strict=True) if name not in dying]
        rise = measure_rise(entry, arguments, self.device)
        del kept
        if arguments:
            log.warning("Inductor's boxed call kept its arguments; this run of the schedule is not fused")
            return None
        seconds = call_seconds(entry, [example_value(self.fx_nodes[name]) for name in inputs], self.device)
        self.rises[cache_key] = self.fresh_rises[cache_key] = rise
        self.times[cache_key] = self.fresh_times[cache_key] = seconds
        return rise, seconds

    def store(self) -> None:
        if self.fresh_rises:
            merge_entries(self.path, dict(self.fresh_rises), finite_number)
        if self.fresh_times:
            merge_entries(self.times_path, dict(self.fresh_times), finite_number)
