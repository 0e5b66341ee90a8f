"""The exhaustive oracle's shortcuts (only useful S entries, the fewest computations S allows) lose nothing: on the
tiniest graphs it gives the same frontier as trying every R and S that meets the paper's constraints."""

from __future__ import annotations

import numpy as np
import pytest
from exhaustive import cheapest_at, cost_peak_frontier, fewest_computations, full_frontier, meets_constraints
from oracles import with_workspace

from checkmate.examples import linear_graph
from checkmate.graph import Graph, Node

SKIP4 = Graph(
    (
        Node("a", 2.0, 3),
        Node("b", 1.0, 2, inputs=(0,)),
        Node("loss", 1.0, 1, backward=True, inputs=(0, 1)),
        Node("grad", 3.0, 2, backward=True, inputs=(0, 2)),
    ),
    fixed_memory=1,
)
TINY = {
    "chain1": linear_graph(1),
    "chain1_workspace": with_workspace(linear_graph(1), seed=1),
    "skip4": SKIP4,
    "skip4_workspace": with_workspace(SKIP4, seed=2),
}


@pytest.mark.parametrize("name", list(TINY))
def test_the_shortcut_search_equals_the_full_enumeration(name: str) -> None:
    shortcut, full = cost_peak_frontier(TINY[name]), full_frontier(TINY[name])
    assert shortcut[0][0] == full[0][0], "the same smallest feasible budget"
    for budget in range(full[0][0], full[-1][0] + 2):
        assert cheapest_at(shortcut, budget) == cheapest_at(full, budget), budget


def test_the_constraint_check_rejects_what_the_paper_forbids() -> None:
    graph = SKIP4
    S = np.zeros((4, 4), dtype=bool)
    assert fewest_computations(graph, S)[3].tolist() == [True, True, True, True], "nothing held: all again"
    S[3, 2] = True
    R = fewest_computations(graph, S)
    assert meets_constraints(graph, R, S)
    assert R[3].tolist() == [True, False, False, True], "loss held into stage 3: only a is computed again"
    missing_input = R.copy()
    missing_input[3, 0] = False
    assert not meets_constraints(graph, missing_input, S), "(1b): grad reads a, neither computed nor held"
    frontier_skipped = fewest_computations(graph, np.zeros((4, 4), dtype=bool))
    frontier_skipped[1, 1] = False
    assert not meets_constraints(graph, frontier_skipped, np.zeros((4, 4), dtype=bool)), "(8a): b first in stage 1"
    held_from_nowhere = S.copy()
    held_from_nowhere[2, 1] = True
    no_source = fewest_computations(graph, np.zeros((4, 4), dtype=bool))
    no_source[1, 1] = False
    assert not meets_constraints(graph, no_source, held_from_nowhere), "(1c): b held into stage 2, never computed"
