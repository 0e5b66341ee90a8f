"""Starting plans given as held forward nodes (`checkmate.strategies.held_start`), and the searches that take them.

Oracles: `check_plan` (every dependency computed or held, the budget met), checkpoint_all's cost (holding every forward
node recomputes nothing) and the start's own cost (a search given it returns no more).
"""

from __future__ import annotations

import pytest

from checkmate import InfeasibleBudget, check_plan, solve
from checkmate.examples import linear_graph, random_training_graph
from checkmate.strategies.held_start import HeldStart, held_start_plan
from checkmate.strategies.segments import forward_nodes

GRAPHS = [
    linear_graph(8),
    *(random_training_graph(n, seed=seed, skip_probability=0.4) for n, seed in [(8, 1), (14, 2)]),
]


@pytest.mark.parametrize("graph", GRAPHS, ids=lambda graph: f"{graph.size} nodes")
def test_a_held_set_is_a_valid_plan_that_recomputes_what_it_does_not_hold(graph) -> None:
    forward = forward_nodes(graph)
    everything = held_start_plan(graph, HeldStart("all", tuple(forward)), method="all")
    check_plan(graph, everything.R, everything.S)
    assert everything.cost == pytest.approx(solve(graph, None, method="checkpoint_all").cost)
    nothing = held_start_plan(graph, HeldStart("none", ()), method="none")
    check_plan(graph, nothing.R, nothing.S)
    assert nothing.cost > everything.cost
    assert nothing.peak_memory <= everything.peak_memory


@pytest.mark.parametrize("method", ["optimal", "approx"])
def test_a_search_out_of_time_answers_with_the_given_start(method: str) -> None:
    """With no time at all the baselines are not tried, the given start is: the answer costs no more than it (the
    search without it finds nothing)."""
    graph = linear_graph(8)
    forward = forward_nodes(graph)
    start = HeldStart("every other", tuple(forward[::2]))
    given = held_start_plan(graph, start, method=start.label)
    budget = given.peak_memory
    assert budget < solve(graph, None, method="checkpoint_all").peak_memory, "the start must recompute"
    with pytest.raises(InfeasibleBudget):
        solve(graph, budget, method=method, time_limit=0, progress=False)
    plan = solve(graph, budget, method=method, time_limit=0, progress=False, extra_starts=(start,))
    check_plan(graph, plan.R, plan.S)
    assert plan.peak_memory <= budget
    assert plan.cost <= given.cost


@pytest.mark.parametrize("graph", GRAPHS[1:2], ids=lambda graph: f"{graph.size} nodes")
def test_a_search_costs_at_most_a_start_that_fits(graph) -> None:
    forward = forward_nodes(graph)
    starts = tuple(HeldStart(f"first {k}", tuple(forward[:k])) for k in range(0, len(forward), 2))
    for start in starts:
        given = held_start_plan(graph, start, method=start.label)
        plan = solve(graph, given.peak_memory, method="optimal", time_limit=5, progress=False, extra_starts=starts)
        assert plan.cost <= given.cost + 1e-9
