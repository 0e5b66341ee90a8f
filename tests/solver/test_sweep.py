"""Sweeps against known numbers: binomial checkpointing and the MILP on unit chains, optimal at or below every
other method on a branching graph, and the same rows from Ray as from this process."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from checkmate.cli import main
from checkmate.examples import linear_graph, random_training_graph
from checkmate.experiments.sweep import budget_grid, sweep

# Unit chain of 6 layers (13 nodes) at budgets 3..8 bytes: griewank (revolve) is optimal there (BENCHMARKS.md).
CHAIN6_OPTIMAL = [28.0, 18.0, 16.0, 15.0, 14.0, 13.0]


def test_a_chain_sweep_has_the_known_costs() -> None:
    rows = sweep(linear_graph(6), range(3, 9), ["checkpoint_all", "chen_sqrtn", "griewank", "optimal"], model="chain")
    cost = {(row.method, row.budget): row.cost for row in rows}
    assert [cost["griewank", budget] for budget in range(3, 9)] == CHAIN6_OPTIMAL
    assert [cost["optimal", budget] for budget in range(3, 9)] == CHAIN6_OPTIMAL
    assert [cost["chen_sqrtn", budget] for budget in range(3, 9)] == [None, None, 16.0, 16.0, 16.0, 16.0]
    everything = [row for row in rows if row.method == "checkpoint_all"]
    assert [row.cost for row in everything] == [None] * 5 + [13.0]  # 2n + 1 unit nodes, at its peak n + 2 = 8
    assert (everything[-1].peak_memory, everything[-1].compute_ratio, everything[-1].status) == (8, 1.0, "feasible")
    assert all(row.status == "optimal" and row.gap < 1e-9 for row in rows if row.method == "optimal")
    assert all(row.compute_ratio == row.cost / 13.0 for row in rows if row.cost is not None)


def test_optimal_is_at_or_below_every_method_at_every_budget() -> None:
    graph = random_training_graph(8, seed=2)
    rows = sweep(graph, budget_grid(graph, 5), options={"time_limit": 60})
    best = {row.budget: row for row in rows if row.method == "optimal"}
    assert all(row.status == "optimal" for row in best.values()), "every budget of the grid has a proven optimum"
    compared = [row for row in rows if row.method != "optimal" and row.cost is not None]
    for row in compared:
        assert best[row.budget].cost <= row.cost * (1 + 1e-9), f"{row.method} beats optimal at {row.budget}"
    assert any(best[row.budget].cost < row.cost * (1 - 1e-3) for row in compared), "some baseline recomputes more"
    assert len({row.method for row in compared}) >= 5


@pytest.mark.slow
def test_ray_gives_the_numbers_local_processes_give(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("ray")
    graph_file = tmp_path / "random.json"
    graph_file.write_text(random_training_graph(8, seed=2).to_json())
    common = ["sweep", str(graph_file), "--points", "3", "--time-limit", "60"]
    common += ["--methods", "checkpoint_all,chen_sqrtn_linear,chen_greedy_linear,optimal"]
    assert main([*common, "--workers", "1", "--out", str(tmp_path / "local.json")]) == 0
    assert main([*common, "--ray", "local", "--out", str(tmp_path / "ray.json")]) == 0
    assert "12 solves on Ray (local)" in capsys.readouterr().out
    local, remote = (json.loads((tmp_path / name).read_text()) for name in ("local.json", "ray.json"))
    # Equal-cost optima may differ in peak, so optimal's rows are compared by status and cost (proven optimal).
    keys = ("model", "method", "budget", "status", "cost", "compute_ratio")
    assert [{key: row[key] for key in keys} for row in remote] == [{key: row[key] for key in keys} for row in local]

    def baselines(rows: list[dict[str, object]]) -> list[dict[str, object]]:
        return [{k: v for k, v in row.items() if k != "seconds"} for row in rows if row["method"] != "optimal"]

    assert baselines(remote) == baselines(local) and len(baselines(local)) == 9
