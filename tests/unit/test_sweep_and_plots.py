import itertools
import json
import subprocess
import sys
import time

import pytest

from checkmate import solve
from checkmate.cli import main
from checkmate.examples import linear_graph, random_training_graph
from checkmate.experiments.plots import plot_sweep
from checkmate.experiments.sweep import budget_grid, sweep
from checkmate.strategies.feasibility import minimum_budget


def test_budget_grid_runs_from_the_smallest_feasible_budget_to_the_checkpoint_all_peak() -> None:
    graph = random_training_graph(8, seed=2)
    grid = budget_grid(graph, 4)
    assert grid[-1] == solve(graph, None).peak_memory
    assert grid[0] == minimum_budget(graph).upper and grid == sorted(grid) and len(grid) == 4
    assert solve(graph, grid[0], method="chen_greedy_linear").peak_memory <= grid[0]  # the bottom has a plan
    assert budget_grid(linear_graph(6), 4) == [3, 5, 6, 8]
    with pytest.raises(ValueError, match="at least 2"):
        budget_grid(graph, 1)


GRID_GRAPH = random_training_graph(6, seed=3)  # its smallest budget, 57 B, is below every baseline's peak (61 B and up)


def test_a_budget_grid_is_the_same_however_fast_the_clock_runs(tmp_path, monkeypatch: pytest.MonkeyPatch) -> None:
    graph_file = tmp_path / "graph.json"
    graph_file.write_text(GRID_GRAPH.to_json())
    arguments = ["sweep", str(graph_file), "--points", "4", "--methods", "checkpoint_all", "--workers", "1"]

    def swept(name: str) -> list[int]:
        assert main([*arguments, "--out", str(tmp_path / name)]) == 0
        return sorted({row["budget"] for row in json.loads((tmp_path / name).read_text())})

    calm = budget_grid(GRID_GRAPH, 4)
    assert swept("calm.json") == calm and len(calm) == 4
    real_clock, calls = time.perf_counter, itertools.count()
    monkeypatch.setattr(time, "perf_counter", lambda: real_clock() + 1000.0 * next(calls))  # a machine far slower
    assert budget_grid(GRID_GRAPH, 4) == calm
    assert swept("hurried.json") == calm


def test_a_budget_grid_waits_for_no_search_of_the_smallest_budget() -> None:
    # The peak-minimising MILP does not prove this 41-node graph's smallest budget in minutes.
    code = (
        "from checkmate.examples import random_training_graph\n"
        "from checkmate.experiments.sweep import budget_grid\n"
        "print(budget_grid(random_training_graph(20, seed=0), 4))\n"
    )
    try:
        result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=False)
    except subprocess.TimeoutExpired:
        pytest.fail("budget_grid ran for more than 60 s on a 41-node graph")
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[123, 140, 157, 174]"  # from the lowest baseline peak to checkpoint_all's


def test_sweep_rows_are_within_their_budgets_and_monotone_for_greedy() -> None:
    graph = random_training_graph(8, seed=2)
    methods = ["checkpoint_all", "chen_greedy_linear"]
    rows = sweep(graph, budget_grid(graph, 5), methods, model="random")
    assert [(row.model, row.method) for row in rows[:2]] == [("random", method) for method in methods]
    assert len(rows) == 10 and all(row.nodes == graph.size and row.variables > 0 for row in rows)
    greedy = [row for row in rows if row.method == "chen_greedy_linear"]
    assert all(row.peak_memory is not None and row.peak_memory <= row.budget for row in greedy), "a plan everywhere"
    costs = [row.cost for row in greedy]
    assert costs == sorted(costs, reverse=True), "a larger budget never makes the cheapest greedy plan dearer"
    assert costs[0] > costs[-1], "the tightest budget costs recomputation"
    everything = [row for row in rows if row.method == "checkpoint_all"]
    assert [row.status for row in everything] == ["infeasible"] * 4 + ["feasible"]
    assert everything[-1].compute_ratio == 1.0 and "needs at least" in str(everything[0].error)


def test_cli_sweep_and_solve_write_plots(tmp_path, capsys) -> None:
    pytest.importorskip("matplotlib")
    graph_file = tmp_path / "chain.json"
    graph_file.write_text(linear_graph(5).to_json())
    sweep_png, memory_png = tmp_path / "sweep.png", tmp_path / "memory.png"
    arguments = ["sweep", str(graph_file), "--points", "3", "--methods", "chen_sqrtn,griewank", "--workers", "1"]
    assert main([*arguments, "--plot", str(sweep_png)]) == 0
    assert main(["solve", str(graph_file), "--budget", "6", "--method", "griewank", "--plot", str(memory_png)]) == 0
    for png in (sweep_png, memory_png):
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 5000
    assert "griewank" in capsys.readouterr().out


def test_plot_sweep_draws_a_panel_per_model(tmp_path) -> None:
    pytest.importorskip("matplotlib")
    rows = [
        *sweep(linear_graph(5), [4, 7], ["chen_sqrtn"], model="five"),
        *sweep(linear_graph(9), [5, 11], ["chen_sqrtn"], model="nine"),
    ]
    one = plot_sweep(rows[:2], tmp_path / "one.png")
    two = plot_sweep(rows, tmp_path / "two.png")
    from matplotlib.image import imread

    assert imread(two).shape[1] > 1.8 * imread(one).shape[1]


def test_an_option_the_method_does_not_take_is_a_clear_error() -> None:
    with pytest.raises(ValueError, match="takes no option 'time_limit'"):
        solve(linear_graph(3), None, method="chen_sqrtn", time_limit=5)
