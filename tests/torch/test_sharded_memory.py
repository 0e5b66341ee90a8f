"""`checkmate.sharded.memory` against figures worked out by hand on a four-node schedule of two units.

Unit 0 is the root (kept gathered after the forward), unit 1 a block (resharded after it). Nodes 0 and 1 are the
forward (they read units 0 and 1), node 2 reads unit 1 and makes its gradients (20 bytes), node 3 reads unit 0 and
makes its gradients (10 bytes). The calls are placed as `place_unit_calls` places them:
gather 0, C0, gather 1, C1, free 1, gather 1, C2, reduce 1, C3, reduce 0 (and with prefetching, each gather of
unit 1 started early). Every moment up to the first reduce also holds the reduce-scatter input FSDP2 kept from the
step before, the last reduce's (unit 0's, 10 bytes).
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from checkmate.graph import Graph, Node
from checkmate.sharded.captured_units import unit_fetches
from checkmate.sharded.memory import (
    SolverExtras,
    UnitBytes,
    held_at_computes,
    sharded_peak,
    sharded_usage,
    solver_extras,
    stage_memory,
)
from checkmate.sharded.timeline import FREE, GATHER, PREFETCH, REDUCE, UnitCall, UnitUse, place_unit_calls
from checkmate.simulate import Compute, Free, Schedule, lower

SCHEDULE = Schedule(
    tuple(Compute(node, node) for node in range(4)), cost=4.0, peak_memory=300, usage=(100, 200, 300, 250)
)
USE = UnitUse(
    reads=(frozenset({0}), frozenset({1}), frozenset({1}), frozenset({0})),
    gradients=(frozenset(), frozenset(), frozenset({1}), frozenset({0})),
    last_forward_stage=1,
    reshard_after_forward=(False, True),
)


def _sizes(collectives_copy: bool, shards_made_at_reduce: bool = False) -> UnitBytes:
    return UnitBytes(
        parameters=(10, 20),
        gradients=(10, 20),
        parameter_shards=(5, 10),
        gradient_shards=(5, 10),
        made=({}, {}, {1: 20}, {0: 10}),
        fixed_memory=50,
        collectives_copy=collectives_copy,
        shards_made_at_reduce=shards_made_at_reduce,
    )


def test_gradient_shards_count_from_their_reduce_when_the_step_makes_them() -> None:
    """With no `.grad`s at the start (`gradient_memory="when_made"`), each REDUCE makes its unit's gradient shards
    (unit 1: 10), held from the moment after it to the end: C3 and reduce 0 hold 10 more than in the hand count."""
    sizes = _sizes(collectives_copy=False, shards_made_at_reduce=True)
    assert sharded_usage(SCHEDULE, USE, sizes) == (80, 120, 160, 240, 240, 260, 340, 390, 290, 315)


@pytest.mark.parametrize(
    ("collectives_copy", "prefetch", "expected"),
    [
        # gather 0: fixed 50 + its flat buffer and outputs 2 x 10; C0: 100 + unit 0; gather 1: 100 + 10 + 2 x 20; ...
        # reduce 1: 300 + both units' parameters 30 + unit 1's gradients 20 + its reduce-scatter input and output 30;
        # C3: 250 + unit 0 + the reduce-scatter input FSDP2 keeps 20; reduce 0: 250 + 10 + 10 + 20 + 10 + 5.
        (False, False, (80, 120, 160, 240, 240, 260, 340, 390, 280, 305)),
        # gloo's copies: 15 per unit-0 collective, 30 per unit-1 collective, during the call: gather 0 80 + 15,
        # gather 1 160 + 30, reduce 1 390 + 30, reduce 0 305 + 15; nothing of a finished collective after it
        (True, False, (95, 120, 190, 240, 240, 290, 340, 420, 280, 320)),
        # prefetching with gloo's copies: a prefetched gather's copies are its prefetch's (30), held from the prefetch
        # to the gather (C0: 140 + 30), the gather's own none
        (True, True, (95, 120, 170, 190, 240, 240, 270, 290, 340, 420, 280, 320)),
        # prefetching: gather 0, prefetch 1 (its flat buffer, 20), C0, gather 1 (the buffer and the outputs), C1,
        # free 1, prefetch 1 (after the free), gather 1, C2, reduce 1, C3, reduce 0
        (False, True, (80, 90, 140, 160, 240, 240, 240, 260, 340, 390, 280, 305)),
    ],
)
def test_usage_matches_the_hand_count(collectives_copy: bool, prefetch: bool, expected: tuple[int, ...]) -> None:
    sizes, use = _sizes(collectives_copy), dataclasses.replace(USE, prefetch_gathers=prefetch)
    assert sharded_usage(SCHEDULE, use, sizes) == expected
    assert sharded_peak(SCHEDULE, use, sizes) == max(expected)


def test_unit_calls_count_in_the_stage_of_the_compute_step_before_them() -> None:
    """Per stage, the largest moment (`StageMemory.peaks`) and, without a plan's presence, everything the units hold
    (`SolverExtras`): gather 1 belongs to stage 0, free 1 and the second gather 1 to stage 1, reduce 1 to stage 2,
    reduce 0 to stage 3. Gather 1 holds unit 0's 10 + 40 + the kept reduce-scatter input 10; reduce 1 holds 90 (390 -
    C2's 300)."""
    sizes = _sizes(collectives_copy=False)
    stages = stage_memory(SCHEDULE, USE, sizes)
    assert stages.peaks == (160, 260, 390, 305)
    # what they hold at C0..C3 (the kept reduce-scatter input 10 and the gathered units) and, beyond it, at the calls
    # right after each node's run: gather 1 60 after C0, free 1 and gather 1 60 after C1, reduce 1 90, reduce 0 55
    assert solver_extras(SCHEDULE, USE, sizes) == SolverExtras((30, 40, 40, 30), (30, 20, 50, 25), (0, 0, 0, 0))
    assert stages.peak == sharded_peak(SCHEDULE, USE, sizes)


@pytest.mark.parametrize("collectives_copy", [False, True])
def test_a_solver_given_the_extras_counts_at_least_each_stage_s_peak(collectives_copy: bool) -> None:
    """`solver_extras`' `stage_held` beside each compute step's usage and `after_own_run` beside the usage of the
    stage's own node's run (what the simulator counts given them) is at least every moment of the stage, with
    FSDP2's placement (a plan's presence, whose gathers open stages, needs the usage at each stage's start:
    `test_sharded.py` replays real ones)."""
    sizes = _sizes(collectives_copy)
    for schedule, use in ((SCHEDULE, USE), (SCHEDULE, BLOCKS)):
        extras = solver_extras(schedule, use, sizes)
        seen = [
            max(used for step, used in zip(schedule.steps, schedule.usage, strict=True) if step.stage == stage)
            for stage in range(len(extras.stage_held))
        ]
        own = [used for step, used in zip(schedule.steps, schedule.usage, strict=True) if step.stage == step.node]
        counted = [
            max(seen_usage + held, own_usage + held + after)
            for seen_usage, own_usage, held, after in zip(
                seen, own, extras.stage_held, extras.after_own_run, strict=True
            )
        ]
        peaks = stage_memory(schedule, use, sizes).peaks
        assert all(c >= p for c, p in zip(counted, peaks, strict=True))


# Two blocks, both freed after their forward by FSDP2: node 0 reads unit 0 and node 1 unit 1 (the forward), node 2
# reads unit 1 and makes its gradients, node 3 reads unit 0 and makes its gradients. Freed after their forward, the
# calls are gather 0, C0, free 0, gather 1, C1, free 1, gather 1, C2, reduce 1, gather 0, C3, reduce 0.
BLOCKS = dataclasses.replace(USE, reshard_after_forward=(True, True))


def _planned(presence: list[list[bool]], prefetch: bool = False, collectives_copy: bool = False) -> Schedule:
    """SCHEDULE planned with the units' `presence` (per stage, per unit): the simulator's usage then counts the
    present units' parameters (10 and 20 bytes) in each stage, and with prefetching those of a unit gathered in the
    next stage; and the gathers' workspaces: in the stage of each gather its flat buffer (10, 20) and gloo's copies
    (15, 30), in the stage before a prefetched gather its copies."""
    present = np.array(presence, dtype=bool)
    gathered = present & ~np.vstack([np.zeros((1, 2), dtype=bool), present[:-1]])
    ahead = np.vstack([gathered[1:], np.zeros((1, 2), dtype=bool)]) & prefetch
    copies = np.array([15, 30]) if collectives_copy else np.zeros(2, dtype=int)
    counted = (present | ahead).astype(int) @ np.array([10, 20])
    counted += gathered.astype(int) @ (np.array([10, 20]) + copies) + ahead.astype(int) @ copies
    usage = np.array(SCHEDULE.usage) + counted
    return dataclasses.replace(
        SCHEDULE,
        usage=tuple(map(int, usage)),
        peak_memory=int(usage.max()),
        presence=present,
        fetched_bytes=tuple(map(int, counted)),
    )


def test_a_unit_the_plan_holds_is_gathered_once() -> None:
    """Unit 1 present in stages 1 and 2, unit 0 in 0 and 3: gather 0, C0, free 0, gather 1, C1, C2, reduce 1,
    gather 0, C3, reduce 0; the present parameters leave the graph's usage and count at the calls, as without a
    presence."""
    sizes = _sizes(collectives_copy=False)
    schedule = _planned([[True, False], [False, True], [False, True], [True, False]])
    steps = place_unit_calls(schedule.steps, BLOCKS, schedule.presence)
    calls = [(step.action, step.unit) for step in steps if isinstance(step, UnitCall)]
    assert calls == [(GATHER, 0), (FREE, 0), (GATHER, 1), (REDUCE, 1), (GATHER, 0), (REDUCE, 0)]
    assert sharded_usage(schedule, BLOCKS, sizes) == (80, 120, 120, 150, 230, 330, 380, 340, 280, 305)
    assert stage_memory(schedule, BLOCKS, sizes).peak == sharded_peak(schedule, BLOCKS, sizes) == 380


@pytest.mark.parametrize("prefetch", [False, True])
@pytest.mark.parametrize("collectives_copy", [False, True])
def test_a_presence_holding_every_unit_places_the_calls_as_fsdp2_places_kept_units(
    prefetch: bool, collectives_copy: bool
) -> None:
    """The oracle: FSDP2's placement of units it never reshards after the forward. The extras are what the units
    hold that the plan does not count."""
    sizes = _sizes(collectives_copy)
    blocks = dataclasses.replace(BLOCKS, prefetch_gathers=prefetch)
    kept = dataclasses.replace(blocks, reshard_after_forward=(False, False))
    schedule = _planned([[True, False], [True, True], [True, True], [True, False]], prefetch, collectives_copy)
    assert sharded_usage(schedule, blocks, sizes) == sharded_usage(SCHEDULE, kept, sizes)
    stages, expected = stage_memory(schedule, blocks, sizes), stage_memory(SCHEDULE, kept, sizes)
    assert stages.peaks == expected.peaks
    # what the plan counts for the units: with prefetching, unit 1's buffer from stage 0; each gather's workspace in
    # its stage (its flat buffer and gloo's copies), and with prefetching unit 1's copies in flight in stage 0
    # what no plan counts: the kept reduce-scatter input 10 to reduce 1; there unit 1's gradients 20, its reduce-scatter
    # input and output 30 and gloo's copies 30 (its parameters are present in stage 2, where it reduces); then
    # reduce 0: 10 + 20 + 15 + copies 15
    copies = (15, 30) if collectives_copy else (0, 0)
    expected_extras = SolverExtras((10, 10, 10, 20), (0, 0, 50 + copies[1], 25 + copies[0]), (0,) * 4)
    assert solver_extras(schedule, blocks, sizes) == expected_extras


def test_a_read_where_the_plan_has_no_unit_gathered_is_refused() -> None:
    schedule = _planned([[True, False], [False, False], [False, True], [True, False]])
    with pytest.raises(ValueError, match="stage 1 reads a unit"):
        place_unit_calls(schedule.steps, BLOCKS, schedule.presence)


def test_a_prefetch_starts_in_the_stage_before_the_plan_makes_a_unit_present() -> None:
    """Unit 1 present in stages 1 and 2, unit 0 in 0 and again from stage 2, a stage before its read in stage 3 (a
    deeper prefetch, the plan's choice): unit 1's all-gather starts at the start of stage 0, unit 0's second at the
    start of stage 1; each GATHER waits for its all-gather at the start of the first stage the plan has the unit
    present in, where the plan counts it. The buffers count in the plan's usage from there
    (`checkmate.fetched.on_device`), and so do the gathers' workspaces (their flat buffers, in the stage of each
    GATHER), so neither is in the stages' extras."""
    sizes = _sizes(collectives_copy=False)
    use = dataclasses.replace(BLOCKS, prefetch_gathers=True)
    schedule = _planned([[True, False], [False, True], [True, True], [True, False]], prefetch=True)
    steps = place_unit_calls(schedule.steps, use, schedule.presence)
    order = [(step.action, step.unit) if isinstance(step, UnitCall) else step.node for step in steps]
    assert order == [
        (GATHER, 0), (PREFETCH, 1), 0, (FREE, 0), (GATHER, 1), (PREFETCH, 0), 1, (GATHER, 0), 2, (REDUCE, 1), 3,
        (REDUCE, 0),
    ]  # fmt: skip
    # the graph's own part is (100, 200, 300, 250); C0: 100 + unit 0 10 + unit 1's buffer 20 + the kept reduce-scatter
    # input 10; GATHER 1: 100 + its buffer and outputs 2 x 20 + 10; PREFETCH 0: 100 + unit 1 20 + unit 0's buffer 10
    # + 10; C1: 200 + 40; GATHER 0 (no stage start here: on C1's usage): 200 + unit 1 20 + unit 0's buffer and outputs
    # 2 x 10 + 10; C2 300 + 40; REDUCE 1 as before; C3: 250 + unit 0 10 + unit 1's kept input 20
    assert sharded_usage(schedule, use, sizes) == (80, 90, 140, 140, 150, 140, 240, 250, 340, 390, 280, 305)
    # what no plan counts: the kept input 10 to REDUCE 1 (60: 20 + 10 + 30, 50 beyond C2's 10; unit 1's parameters
    # are present in stage 2), then unit 1's kept input 20, and REDUCE 0's 45 (25 beyond C3's 20)
    assert solver_extras(schedule, use, sizes) == SolverExtras((10, 10, 10, 20), (0, 0, 50, 25), (0, 0, 0, 0))


def test_a_call_that_opens_a_stage_counts_on_the_usage_at_its_start() -> None:
    """With a free of the graph's after C1 and the usage at each stage's start (`Schedule.stage_start`): FREE 1,
    placed after C1 and before that free, counts on C1's usage as in the hand count (240); the second GATHER 1,
    between the free and C2, opens stage 2: 170 at its start + unit 0 10 + the buffer and outputs 2 x 20 + the kept
    reduce-scatter input 10 = 230 (on C1's usage: 260), in stage 2; REDUCE 1, with nothing freed between C2 and C3,
    opens stage 3 at C2's usage (390, as in the hand count), in stage 3."""
    steps = (Compute(0, 0), Compute(1, 1), Free(0, 1), Compute(2, 2), Compute(3, 3))
    schedule = dataclasses.replace(SCHEDULE, steps=steps, stage_start=(50, 90, 170, 300))
    sizes = _sizes(collectives_copy=False)
    assert sharded_usage(schedule, USE, sizes) == (80, 120, 150, 240, 240, 230, 340, 390, 280, 305)
    assert stage_memory(schedule, USE, sizes).peaks == (120, 240, 340, 390)
    # a solver counts each opening on the stage's start: stage 3's, 300 + what C3 holds 30 + 60 = REDUCE 1's 390
    extras = solver_extras(schedule, USE, sizes)
    assert extras == SolverExtras((20, 40, 40, 30), (0, 0, 0, 25), (10, 20, 20, 60))
    assert schedule.stage_start[3] + extras.stage_held[3] + extras.opening_held[3] == 390


@pytest.mark.parametrize("prefetch", [False, True])
def test_gloo_copies_count_only_while_their_collective_runs(prefetch: bool) -> None:
    """gloo's copies of a collective are held while it runs, and a prefetched gather's from its PREFETCH to its
    GATHER (at C0, 40 + 20), never at a compute moment after: a worker thread drops a finished collective's buffers
    as its run returns, which the allocator meter, counting every thread's frees, shows within the count's margins."""
    use = dataclasses.replace(USE, reshard_after_forward=(False, False), prefetch_gathers=prefetch)
    sizes = {
        copies: dataclasses.replace(
            _sizes(copies), parameters=(10, 40), parameter_shards=(5, 20), gradients=(10, 10), gradient_shards=(5, 5)
        )
        for copies in (False, True)
    }
    with_copies, without = (held_at_computes(SCHEDULE, use, sizes[copies]) for copies in (True, False))
    in_flight = 60 if prefetch else 0
    assert [a - b for a, b in zip(with_copies, without, strict=True)] == [in_flight, 0, 0, 0]


# The same step as a graph the simulator plans (1 byte a node, node 3 reading node 0's output too), with the
# units' parameters as its fetched values: the plan's own count of every gather.
GRAPH = Graph(
    (
        Node("forward 0", 1.0, 1),
        Node("forward 1", 1.0, 1, inputs=(0,)),
        Node("backward 1", 1.0, 1, backward=True, inputs=(1,)),
        Node("backward 0", 1.0, 1, backward=True, inputs=(2, 0)),
    ),
    fixed_memory=50,
)


@pytest.mark.parametrize("collectives_copy", [False, True])
def test_each_units_fetch_holds_its_gathers_buffers(collectives_copy: bool) -> None:
    """The plan's fetched value of each unit counts what its gather holds beside the parameters where the plan
    gathers it: the flat all-gather buffer (10, 20) and on gloo the copies of it and of the shard (15, 30) at the
    start of the stage of the GATHER, where it runs; prefetched, the copies through the stage before, beside the
    buffer. The plan of the four-node step that gathers unit 0 again for its backward counts them at the starts of
    stages 0 and 3 (unit 0) and 1 (unit 1), and the parameters through each stage that has its unit present."""
    sizes = _sizes(collectives_copy)
    fetched = unit_fetches(BLOCKS, sizes, GRAPH.size, (1.0, 1.0), (0.5, 0.25), released_before_backward=False)
    copies = (15, 30) if collectives_copy else (0, 0)
    assert [value.fetch_workspace for value in fetched] == [10 + copies[0], 20 + copies[1]]
    assert [value.in_flight_workspace for value in fetched] == list(copies)
    assert [value.release_cost for value in fetched] == [0.5, 0.25], "each unit makes gradients: it is released"
    graph = dataclasses.replace(GRAPH, fetched=fetched)
    schedule = lower(graph, np.eye(4, dtype=bool), np.tril(np.ones((4, 4), dtype=bool), -1))
    assert schedule.presence.astype(int).tolist() == [[1, 0], [0, 1], [0, 1], [1, 0]]
    assert schedule.fetched_bytes == (10, 20, 20, 10)
    gathers = np.array([10 + copies[0], 20 + copies[1], 0, 10 + copies[0]])
    assert schedule.openings == tuple(int(start) for start in np.array(schedule.stage_start) + gathers)
