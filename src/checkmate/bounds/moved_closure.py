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
plan with or without moves. A cut is every movable node of F (out) and every first stage after b that reads one
(back). The sums over a cut are cumulative columns, one per movable node in each direction (out_j >= out_(j+1) +
work_j a_j in node order, back_j >= back_(j-1) + work_j a_j in order of first use after b), and the recomputations'
lending is one column (lent <= overlap x sum c'_u r_u): each cut is a row of three entries, so every cut is
kept and the MILP stays as sparse as the closure bound's.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import scipy.sparse as sp

from checkmate.bounds.closure import ClosureBound, StageMilp, closure_bound, stage_problem
from checkmate.graph import Graph


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
    a graph without a host link; None when nothing crosses the stage. Its columns are [h | r | a | X | out | back |
    lent] (`link_columns`)."""
    base = stage_problem(graph, budget, stage)
    link = graph.host_link
    if base is None or link is None:
        return base
    nodes, problem = base.nodes, base.problem
    n = nodes.size
    unit = _x_unit(graph, nodes)
    least_before = np.concatenate([[0.0], np.cumsum(graph.costs)])  # least_before[k]: every node once in stages < k
    orders = _link_orders(graph, stage, nodes)
    m_out, m_in = orders.out.size, orders.back.size
    columns = 3 * n + 1 + m_out + m_in + 1
    x_column, out_columns = 3 * n, 3 * n + 1 + np.arange(m_out)
    in_columns, lent_column = 3 * n + 1 + m_out + np.arange(m_in), columns - 1

    # the a columns join the crossing rows and the closure rows' sources
    joining = np.concatenate([base.crossing, base.sources])
    a_block = sp.csc_array((np.ones(joining.size), (np.arange(joining.size), joining)), shape=(problem.A.shape[0], n))
    A = sp.hstack([problem.A, a_block, sp.csc_array((problem.A.shape[0], columns - 3 * n))], format="csc")
    rows = _Rows(columns)

    # the link out, in node order: out_j - out_(j+1) - work_j a_j >= 0 (out_j: the copies of the values made in stage
    # node_j or later), and a cut per node: out_j - X <= overlap x least(node_j..b-1)
    j = np.arange(m_out)
    work = link.to_host_costs(graph.memory[nodes[orders.out]]) / unit
    chain = j[:-1]
    rows.add(
        np.concatenate([j, j, chain]),
        np.concatenate([out_columns, 2 * n + orders.out, out_columns[chain + 1]]),
        np.concatenate([np.ones(m_out), -work, -np.ones(chain.size)]),
        lower=np.zeros(m_out),
    )
    cuts = nodes[orders.out]
    rows.add(
        np.concatenate([j, j]),
        np.concatenate([out_columns, np.full(m_out, x_column)]),
        np.concatenate([np.ones(m_out), -np.ones(m_out)]),
        upper=link.overlap * (least_before[stage] - least_before[cuts]) / unit,
    )

    # the link back, in order of the first stage after b that reads each node (its due): back_j - back_(j-1) -
    # work_j a_j >= 0, lent - overlap x (the r columns' recomputations) <= 0, and a cut per due k: back_j - lent - X
    # <= overlap x least(b+1..k-1) for the last j due by k
    j = np.arange(m_in)
    work = link.to_device_costs(graph.memory[nodes[orders.back]]) / unit
    chain = j[1:]
    rows.add(
        np.concatenate([j, j, chain]),
        np.concatenate([in_columns, 2 * n + orders.back, in_columns[chain - 1]]),
        np.concatenate([np.ones(m_in), -work, -np.ones(chain.size)]),
        lower=np.zeros(m_in),
    )
    recomputed = np.flatnonzero(problem.c[n : 2 * n])
    rows.add(
        np.zeros(recomputed.size + 1, dtype=np.int64),
        np.concatenate([[lent_column], n + recomputed]),
        np.concatenate([[1.0], -link.overlap * problem.c[n + recomputed] / unit]),
        upper=np.zeros(1),
    )
    last = np.flatnonzero(np.append(orders.due[1:] != orders.due[:-1], True)) if m_in else np.zeros(0, np.int64)
    cut = np.arange(last.size)
    rows.add(
        np.concatenate([cut, cut, cut]),
        np.concatenate([in_columns[last], np.full(last.size, lent_column), np.full(last.size, x_column)]),
        np.concatenate([np.ones(last.size), -np.ones(last.size), -np.ones(last.size)]),
        upper=link.overlap * (least_before[orders.due[last]] - least_before[stage + 1]) / unit,
    )

    # host memory
    if link.host_memory is not None:
        sizes = graph.memory[nodes]
        largest = float(max(int(sizes.max(initial=0)), 1))
        rows.add(
            np.zeros(n, dtype=np.int64),
            2 * n + np.arange(n),
            sizes / largest,
            upper=np.array([link.host_memory / largest]),
        )
    link_rows, lower, upper = rows.matrix()
    movable = graph.memory[nodes] > 0
    moved = dataclasses.replace(
        problem,
        c=np.concatenate([problem.c, np.zeros(n), [unit], np.zeros(columns - 3 * n - 1)]),
        A=sp.vstack([A, link_rows], format="csc"),
        row_lower=np.concatenate([problem.row_lower, lower]),
        row_upper=np.concatenate([problem.row_upper, upper]),
        col_lower=np.concatenate([problem.col_lower, np.zeros(columns - 2 * n)]),
        col_upper=np.concatenate([problem.col_upper, movable.astype(np.float64), np.full(columns - 3 * n, np.inf)]),
        integer=np.concatenate([problem.integer, np.ones(n, dtype=bool), np.zeros(columns - 3 * n, dtype=bool)]),
    )
    return dataclasses.replace(base, problem=moved)


def link_columns(graph: Graph, stage: int, nodes: np.ndarray, rebuilt: np.ndarray, away: np.ndarray) -> np.ndarray:
    """The columns after X of `moved_stage_problem`'s MILP for the r and a columns `rebuilt` and `away` (bool over
    `nodes`): the copies out of the values made at or after each movable node, the copies back due by each, and the
    link time the recomputations after the stage lend, each in the X column's unit."""
    link = graph.host_link
    assert link is not None
    unit = _x_unit(graph, nodes)
    orders = _link_orders(graph, stage, nodes)
    out = link.to_host_costs(graph.memory[nodes[orders.out]]) * away[orders.out]
    back = link.to_device_costs(graph.memory[nodes[orders.back]]) * away[orders.back]
    lent = link.overlap * float(graph.recompute_costs[nodes] @ rebuilt)
    return np.concatenate([np.cumsum(out[::-1])[::-1], np.cumsum(back), [lent]]) / unit


def _x_unit(graph: Graph, nodes: np.ndarray) -> float:
    """The unit of X and the link's columns and rows: the largest recomputation of F, so that the rows scale alike."""
    return float(max(graph.recompute_costs[nodes].max(initial=0.0), 1.0))


@dataclass(frozen=True)
class _LinkOrders:
    """The movable nodes of F (positions into it) in the order of the link's rows: `out` by node, `back` by `due`, the
    first stage after b that reads each (the graph's size for a node read after b only by a rebuild)."""

    out: np.ndarray
    back: np.ndarray
    due: np.ndarray


def _link_orders(graph: Graph, stage: int, nodes: np.ndarray) -> _LinkOrders:
    movable = np.flatnonzero(graph.memory[nodes] > 0)
    users_after = [[user for user in graph.users[int(node)] if user > stage] for node in nodes[movable].tolist()]
    due = np.array([users[0] if users else graph.size for users in users_after], dtype=np.int64)
    by_due = np.argsort(due, kind="stable")
    return _LinkOrders(movable, movable[by_due], due[by_due])


class _Rows:
    """Blocks of sparse rows over `columns` columns, each with its rows' bounds (open where not given)."""

    def __init__(self, columns: int) -> None:
        self.columns = columns
        self.blocks: list[sp.csc_array] = []
        self.lower: list[np.ndarray] = []
        self.upper: list[np.ndarray] = []

    def add(
        self,
        rows: np.ndarray,
        columns: np.ndarray,
        values: np.ndarray,
        *,
        lower: np.ndarray | None = None,
        upper: np.ndarray | None = None,
    ) -> None:
        """Rows 0.. of a block: `values` at (`rows`, `columns`), with `lower` and `upper` (one of them given)."""
        bounds = lower if lower is not None else upper
        assert bounds is not None
        count = bounds.size
        self.blocks.append(sp.csc_array((values, (rows, columns)), shape=(count, self.columns)))
        self.lower.append(np.full(count, -np.inf) if lower is None else lower)
        self.upper.append(np.full(count, np.inf) if upper is None else upper)

    def matrix(self) -> tuple[sp.csc_array, np.ndarray, np.ndarray]:
        return sp.vstack(self.blocks, format="csc"), np.concatenate(self.lower), np.concatenate(self.upper)
