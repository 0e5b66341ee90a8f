"""Moves to host memory in the simulator (`checkmate.moved`): a hand count, random plans against a recount written
from the module doc alone, and the rules a plan with moves must keep."""

from __future__ import annotations

import dataclasses
import itertools

import numpy as np
import pytest
from oracles import moved_cost_and_usage, moved_everywhere_but_reads

from checkmate.errors import InvalidGraph, InvalidSchedule
from checkmate.examples import linear_graph, random_training_graph
from checkmate.graph import Graph, Node
from checkmate.moved import HostLink, LinkSpeeds, Moves, stages_covering
from checkmate.simulate import lower
from checkmate.solve import solve

LINK = HostLink(to_host_per_byte=0.25, to_device_per_byte=0.125, latency=0.0, overlap=1.0)


def _chain() -> Graph:
    """The paper's chain of 4 (9 nodes) with output sizes 10, 20, ... 90 bytes and unit costs."""
    graph = linear_graph(4)
    nodes = tuple(dataclasses.replace(node, memory=10 * (index + 1)) for index, node in enumerate(graph.nodes))
    return dataclasses.replace(graph, nodes=nodes, host_link=LINK)


def test_a_value_moved_to_the_host_by_hand() -> None:
    """forward_0 (10 bytes) goes to the host in its own stage and comes back for backward_8 (stage 8): stages 2 to 6
    hold 10 bytes less, stage 7 holds its buffer; the copy out (2.5) hides behind stage 0's compute (1) but
    for 1.5, the copy in (1.25) behind stage 7's but for 0.25."""
    graph = _chain()
    kept = solve(graph, None, method="checkpoint_all")
    S, moves = moved_everywhere_but_reads(graph, kept.R, kept.S, 0)
    assert np.flatnonzero(moves.copy_in[:, 0]).tolist() == [8]
    schedule = lower(graph, kept.R, S, moves=moves)
    held = lower(graph, kept.R, kept.S)
    assert schedule.cost == pytest.approx(held.cost + 1.5 + 0.25)
    assert schedule.host_peak == 10
    no_move = np.array(held.usage)
    moved = np.array(schedule.usage)
    # stage t's single compute step is step t; stage 1 still reads node 0 (held, the copy out being under way),
    # stages 2..6 hold 10 bytes less, stage 7 the buffer instead, stage 8 the copy back
    assert (moved[2:7] == no_move[2:7] - 10).all()
    assert (moved[[0, 1, 7, 8]] == no_move[[0, 1, 7, 8]]).all()
    cost, usage, host = moved_cost_and_usage(graph, kept.R, S, moves)
    assert (schedule.cost, list(schedule.usage), schedule.host_peak) == (pytest.approx(cost), usage, host)


@pytest.mark.parametrize("seed", range(8))
def test_random_moves_match_themoved_cost_and_usage(seed: int) -> None:
    """Random graphs, the plans of two methods, and every node moved in turn: the simulator's cost, device peak and
    host peak equal the recount."""
    rng = np.random.default_rng(seed)
    base = random_training_graph(7, seed=seed)
    link = HostLink(
        to_host_per_byte=float(rng.uniform(0, 0.1)),
        to_device_per_byte=float(rng.uniform(0, 0.1)),
        latency=float(rng.uniform(0, 1)),
        overlap=float(rng.uniform(0, 1)),
    )
    graph = dataclasses.replace(base, host_link=link)
    checked = 0
    for method, node, after_a_read in itertools.product(("checkpoint_all", "chen_sqrtn"), range(7), (False, True)):
        plan = solve(graph, None, method=method)
        if graph.nodes[node].backward or plan.R[:, node].sum() > 1:
            continue  # a node of the forward pass computed once
        S, moves = moved_everywhere_but_reads(graph, plan.R, plan.S, node, after_a_read=after_a_read)
        if not moves.copy_in.any():
            continue
        schedule = lower(graph, plan.R, S, moves=moves)
        cost, usage, host = moved_cost_and_usage(graph, plan.R, S, moves)
        assert (schedule.cost, list(schedule.usage), schedule.host_peak) == (pytest.approx(cost), usage, host)
        checked += 1
    assert checked > 0


def _plain_moves(T: int) -> tuple[np.ndarray, np.ndarray]:
    return np.zeros((T, T), dtype=bool), np.zeros((T, T), dtype=bool)


def test_moves_that_break_a_rule_are_refused() -> None:
    graph = _chain()
    kept = solve(graph, None, method="checkpoint_all")
    T = graph.size
    S, moves = moved_everywhere_but_reads(graph, kept.R, kept.S, 0)

    out, back = _plain_moves(T)
    out[1, 2] = True  # node 2 first runs in stage 2
    with pytest.raises(InvalidSchedule, match=r"\(m1\)"):
        lower(graph, kept.R, kept.S, moves=Moves(out, back))
    out, back = moves.copy_out.copy(), moves.copy_in.copy()
    out[1, 0] = True  # node 0 is held into stage 1: a second copy out
    with pytest.raises(InvalidSchedule, match=r"\(m1\)"):
        lower(graph, kept.R, kept.S, moves=Moves(out, back))
    out, back = _plain_moves(T)
    out[0, 0], back[2, 0] = True, True  # its buffer would fill in stage 1, which still holds node 0
    with pytest.raises(InvalidSchedule, match=r"\(m2\).*on the device in stage 1"):
        lower(graph, kept.R, S, moves=Moves(out, back))
    buffered = moves.buffers(T).copy()
    buffered[5, 0] = True  # a run of buffers that stops at stage 5, with no copy back in stage 6
    with pytest.raises(InvalidSchedule, match=r"\(m2\).*stage 6"):
        lower(graph, kept.R, S, moves=Moves(moves.copy_out, moves.copy_in, buffered))
    buffered = moves.buffers(T).copy()
    buffered[1:8, 0] = True  # a buffer from stage 1, where node 0 is still held
    with pytest.raises(InvalidSchedule, match=r"\(m2\)"):
        lower(graph, kept.R, S, moves=Moves(moves.copy_out, moves.copy_in, buffered))
    out, back = moves.copy_out.copy(), moves.copy_in.copy()
    back[8, 3] = True  # node 3 is never copied out
    with pytest.raises(InvalidSchedule, match=r"\(m2\)"):
        lower(graph, kept.R, S, moves=Moves(out, back))
    with pytest.raises(InvalidSchedule, match=r"\(m3\)"):
        lower(graph, kept.R, kept.S, moves=moves)  # node 0 held and copied back into stage 8
    out, back = moves.copy_out.copy(), moves.copy_in.copy()
    back[8, 0] = False
    with pytest.raises(InvalidSchedule, match=r"\(1b\)"):
        lower(graph, kept.R, S, moves=Moves(out, back))  # backward_8 reads node 0, gone
    with pytest.raises(InvalidSchedule, match="host_link"):
        lower(dataclasses.replace(graph, host_link=None), kept.R, S, moves=moves)
    small = dataclasses.replace(graph, host_link=dataclasses.replace(LINK, host_memory=9))
    with pytest.raises(InvalidSchedule, match=r"\(m4\)"):
        lower(small, kept.R, S, moves=moves)  # forward_0's 10 bytes


def test_a_copy_back_started_early_hides_behind_more_compute() -> None:
    """forward_0's copy back (1.25) started in stage 6 instead of 7 hides behind two stages of compute (1 each): no
    wait, and stage 6 holds the 10-byte buffer too; its copy out's window grows with its holds the same way."""
    graph = _chain()
    kept = solve(graph, None, method="checkpoint_all")
    S, moves = moved_everywhere_but_reads(graph, kept.R, kept.S, 0)
    late = lower(graph, kept.R, S, moves=moves)
    buffered = moves.buffers(graph.size).copy()
    buffered[6, 0] = True
    early_moves = Moves(moves.copy_out, moves.copy_in, buffered)
    early = lower(graph, kept.R, S, moves=early_moves)
    assert early.cost == pytest.approx(late.cost - 0.25)
    assert early.usage[6] == late.usage[6] + 10 and early.usage[7] == late.usage[7]
    cost, usage, _ = moved_cost_and_usage(graph, kept.R, S, early_moves)
    assert (early.cost, list(early.usage)) == (pytest.approx(cost), usage)
    held_longer = S.copy()
    held_longer[2, 0] = True  # held into stage 2: stage 1 joins the copy out's window
    longer = lower(graph, kept.R, held_longer, moves=moves)
    assert longer.cost == pytest.approx(late.cost - 1.0)  # the copy out (2.5) hides behind stages 0 and 1
    assert moved_cost_and_usage(graph, kept.R, held_longer, moves)[0] == pytest.approx(longer.cost)


def test_the_graph_file_keeps_its_host_link() -> None:
    graph = _chain()
    assert Graph.from_json(graph.to_json()).host_link == LINK
    text = graph.to_json().replace('"overlap": 1.0', '"overlap": 2.0')
    with pytest.raises(InvalidGraph, match="overlap"):
        Graph.from_json(text)
    with pytest.raises(ValueError, match="overlap"):
        HostLink(0.1, 0.1, overlap=-0.5)
    assert Graph((Node("only", 1.0, 4),)).host_link is None


def test_a_link_given_in_bytes_per_second() -> None:
    """PCIe-like figures for a graph costed in FLOPs at 400 TFLOP/s: a byte costs 8,000 FLOPs to the host at
    50 GB/s and 16,000 back at 25 GB/s, a copy's 10 us latency 4e9."""
    link = LinkSpeeds(50e9, 25e9, latency=10e-6, overlap=0.5).priced(cost_per_second=400e12, host_memory=1 << 30)
    assert (link.to_host_per_byte, link.to_device_per_byte) == pytest.approx((8_000.0, 16_000.0))
    assert link.latency == pytest.approx(4e9) and link.overlap == 0.5 and link.host_memory == 1 << 30
    assert LinkSpeeds(1e9, 1e9).priced().to_host_per_byte == pytest.approx(1e-9)  # a graph costed in seconds
    with pytest.raises(ValueError, match="bandwidths"):
        LinkSpeeds(0.0, 1e9)
    with pytest.raises(ValueError, match="cost_per_second"):
        LinkSpeeds(1e9, 1e9).priced(cost_per_second=0.0)


def _walked_stage_covering(free: np.ndarray, start: int, work: float, forward: bool) -> int:
    """The stage by stage walk: the first stage whose running total of `free` from `start` reaches `work`."""
    total, stage = 0.0, start
    while 0 <= stage < free.size:
        total += float(free[stage])
        if total >= work:
            return stage
        stage += 1 if forward else -1
    return free.size - 1 if forward else 0


def test_stages_covering_is_the_stage_by_stage_walk() -> None:
    """`stages_covering` against a walk over the stages, on random free times with zeros, starts outside the range,
    and work that is zero, negative, or exactly a running total."""
    rng = np.random.default_rng(0)
    for _ in range(3000):
        size = int(rng.integers(0, 30))
        free = rng.random(size) * float(rng.integers(0, 3))
        free[rng.random(size) < 0.3] = 0.0
        start = int(rng.integers(-2, size + 2))
        totals = np.cumsum(free[max(start, 0) :]) if size else np.zeros(1)
        for work in (0.0, -1.0, float(rng.random() * 5), float(totals[min(len(totals) - 1, 2)] if totals.size else 0)):
            for forward in (True, False):
                expected = _walked_stage_covering(free, start, work, forward)
                assert stages_covering(free, start, work, forward=forward) == expected, (free, start, work, forward)
