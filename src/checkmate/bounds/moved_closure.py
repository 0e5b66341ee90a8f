"""The closure bound where values may move to host memory: what crosses a stage is held, rebuilt or away on the host,
and what is away crossed the link in the time the step had.

`checkmate.bounds.closure` bounds a plan that only keeps or recomputes. A plan with moves (`checkmate.moved`) has a
third way past a stage b: a crossing value is copied out before b, off the device while node b runs, and copied
back after b. Its stage MILP gains, per node u of F, a column

    a_u = 1 when u is off the device while node b runs, is not computed again after b, and is copied back after b

and one continuous column X >= 0, the step's time beyond every node once and the recomputations the r columns
charge (recomputations before b, the waits for the link, further recomputations after b). Take any valid plan with
moves within the budget and set h_u = 1 when u's bytes are on the device while node b runs (held out of stage b,
computed in it before node b, copied out in stage b, or the buffer of a copy back), r_u as the closure bound does,
and a_u as above. Then:

Crossing and closure (rows `h_v + r_v + a_v >= 1`, `h_u + r_u + a_u >= r_v`). Follow the closure bound's argument
back from the stage that reads v: v is computed again after b (r), on the device at node b (h), or copied back in a
stage after b whose buffer starts after b (a).

Memory. Unchanged: the bytes on the device while node b runs are base_b and the h columns'.

The link out (row per cut k: `sum over u >= k of (latency + bytes_u x to_host) a_u - X <= overlap x least(k..b-1)`).
A value with a_u = 1 is off the device at node b, so its copy out was made in a stage t in [u, b - 1] and its
window, the stages from t while it stays held (`checkmate.moved`), ends by stage b - 1: the copy is done by the end
of stage b - 1. The copies of the values made in stage k or later ran in stages k to b - 1, on at most overlap x
their compute plus the waits there; their compute is every node once (least(k..b-1), the graph's costs) plus
recomputations before b, and overlap <= 1, so both extras are within X.

The link back (row per cut k: `sum over a_u with first use after b at most k of (latency + bytes_u x to_device)
a_u - overlap x sum c'_u r_u - X <= overlap x least(b+1..k-1)`). A copy back of u after b fills a buffer whose run
starts after b and ends the stage before the first stage where u is on the device again: at most the first stage
after b that reads u (for a node of F read after b only by a rebuild, the last stage). The stages b+1 to k-1 lend
overlap x (every node once there, plus the recomputations after b) plus the waits: the recomputations after b cost at
least sum c'_u r_u, the rest is within X.

Host memory (row `sum bytes_u a_u <= host_memory`): every copied-out value holds host memory to the end of the step.

Cost. At least every node once + sum c'_u r_u + X, for each stage b: a proven lower bound on the step time of any
plan with or without moves. A cut is a node of F (out) or a stage (back); `CUTS` of each, evenly spread, keep the
rows few (fewer cuts: a weaker bound, never an invalid one).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import numpy as np
import scipy.sparse as sp

from checkmate.bounds.closure import ClosureBound, StageMilp, closure_bound, stage_problem
from checkmate.graph import Graph

CUTS = 48


def moved_closure_bound(
    graph: Graph,
    budget: int,
    *,
    time_limit: float | None = None,
    load_seconds_per_variable: float = 0.0,
    should_stop: Callable[[], bool] | None = None,
    interrupted: Callable[[], bool] | None = None,
) -> ClosureBound:
    """A proven lower bound on the cost of any plan of `graph` within `budget` bytes, moves to host memory included
    (module doc); the closure bound itself on a graph without a host link. Arguments as `closure_bound`'s."""
    return closure_bound(
        graph,
        budget,
        time_limit=time_limit,
        load_seconds_per_variable=load_seconds_per_variable,
        should_stop=should_stop,
        interrupted=interrupted,
        problem_of=moved_stage_problem,
    )


def moved_stage_problem(graph: Graph, budget: int, stage: int) -> StageMilp | None:
    """The closure MILP of `stage` with the a columns, X and the link's rows (module doc); the closure MILP itself on
    a graph without a host link; None when nothing crosses the stage."""
    base = stage_problem(graph, budget, stage)
    link = graph.host_link
    if base is None or link is None:
        return base
    nodes, problem = base.nodes, base.problem
    n = nodes.size
    unit = float(max(problem.c.max(initial=0.0), 1.0))  # X in units of the largest recomputation: rows scale alike
    costs = graph.costs
    least_before = np.concatenate([[0.0], np.cumsum(costs)])  # least_before[k]: every node once in stages < k
    sizes = graph.memory[nodes]
    movable = sizes > 0
    out_work = np.where(movable, link.to_host_costs(sizes), 0.0)
    in_work = np.where(movable, link.to_device_costs(sizes), 0.0)

    # the a columns join the crossing rows and the closure rows' sources
    links = [
        (np.arange(base.crossing.size), base.crossing),
        (base.crossing.size + np.arange(base.sources.size), base.sources),
    ]
    rows = np.concatenate([row for row, _ in links])
    a_block = sp.csc_array(
        (np.ones(rows.size), (rows, np.concatenate([column for _, column in links]))), shape=(problem.A.shape[0], n)
    )
    A = sp.hstack([problem.A, a_block, sp.csc_array((problem.A.shape[0], 1))], format="csc")

    # the link out: one row per cut k over the movable nodes of F, every node made in stage k or later
    cuts_out = _spread(nodes[movable])
    out_rows = (nodes[None, :] >= cuts_out[:, None]) * out_work[None, :]
    out_room = link.overlap * (least_before[stage] - least_before[cuts_out])

    # the link back: one row per cut k over the first stages after b that read a node of F
    users_after = [[user for user in graph.users[node] if user > stage] for node in nodes.tolist()]
    due = np.array([users[0] if users else graph.size for users in users_after], dtype=np.int64)
    cuts_in = _spread(np.unique(due[movable]))
    in_rows = (due[None, :] <= cuts_in[:, None]) * in_work[None, :]
    in_room = link.overlap * (least_before[cuts_in] - least_before[stage + 1])
    recomputed = link.overlap * problem.c[n : 2 * n]  # the r columns' recomputations lend link time after b

    # rows over [h | r | a | X], in cost units over `unit`; every row's lower side is open
    x_column = -np.ones((1, 1))
    blocks = [
        np.hstack([np.zeros((cuts_out.size, 2 * n)), out_rows / unit, np.repeat(x_column, cuts_out.size, axis=0)]),
        np.hstack(
            [
                np.zeros((cuts_in.size, n)),
                -np.repeat(recomputed[None, :], cuts_in.size, axis=0) / unit,
                in_rows / unit,
                np.repeat(x_column, cuts_in.size, axis=0),
            ]
        ),
    ]
    limits = [out_room / unit, in_room / unit]
    if link.host_memory is not None:
        largest = float(max(int(sizes.max(initial=0)), 1))
        blocks.append(np.concatenate([np.zeros(2 * n), sizes / largest, [0.0]])[None, :])
        limits.append(np.array([link.host_memory / largest]))
    upper = np.concatenate(limits)
    moved = dataclasses.replace(
        problem,
        c=np.concatenate([problem.c, np.zeros(n), [unit]]),
        A=sp.vstack([A, *(sp.csc_array(block) for block in blocks)], format="csc"),
        row_lower=np.concatenate([problem.row_lower, np.full(upper.size, -np.inf)]),
        row_upper=np.concatenate([problem.row_upper, upper]),
        col_lower=np.concatenate([problem.col_lower, np.zeros(n + 1)]),
        col_upper=np.concatenate([problem.col_upper, movable.astype(np.float64), [np.inf]]),
        integer=np.concatenate([problem.integer, np.ones(n, dtype=bool), [False]]),
    )
    return dataclasses.replace(base, problem=moved)


def _spread(values: np.ndarray) -> np.ndarray:
    """At most `CUTS` of the sorted `values`, evenly spread, the first among them."""
    if values.size <= CUTS:
        return values
    return np.unique(values[np.linspace(0, values.size - 1, CUTS).astype(np.int64)])
