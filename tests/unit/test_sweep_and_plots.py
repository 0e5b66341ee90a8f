import pytest

from checkmate import solve
from checkmate.cli import main
from checkmate.examples import linear_graph, random_training_graph
from checkmate.sweep import budget_grid, sweep


def test_budget_grid_runs_from_the_floor_to_the_checkpoint_all_peak() -> None:
    graph = linear_graph(6)
    grid = budget_grid(graph, 4)
    assert grid[-1] == solve(graph, None).peak_memory
    assert grid[0] == 3 and grid == sorted(grid)
    with pytest.raises(ValueError, match="at least 2"):
        budget_grid(graph, 1)


def test_sweep_rows_are_within_their_budgets_and_monotone_for_greedy() -> None:
    graph = random_training_graph(8, seed=2)
    points = sweep(graph, budget_grid(graph, 5), ["checkpoint_all", "chen_greedy_linear"])
    assert len(points) == 10
    for point in points:
        assert point.row.peak_memory is None or point.row.peak_memory <= point.budget
    greedy = [p.row.cost for p in points if p.row.method == "chen_greedy_linear" and p.row.cost is not None]
    assert greedy == sorted(greedy, reverse=True), "a larger budget never makes the cheapest greedy plan dearer"


def test_cli_sweep_and_solve_write_plots(tmp_path, capsys) -> None:
    pytest.importorskip("matplotlib")
    graph_file = tmp_path / "chain.json"
    graph_file.write_text(linear_graph(5).to_json())
    sweep_png, memory_png = tmp_path / "sweep.png", tmp_path / "memory.png"
    assert (
        main(["sweep", str(graph_file), "--points", "3", "--methods", "chen_sqrtn,griewank", "--plot", str(sweep_png)])
        == 0
    )
    assert main(["solve", str(graph_file), "--budget", "6", "--method", "griewank", "--plot", str(memory_png)]) == 0
    for png in (sweep_png, memory_png):
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 5000
    assert "griewank" in capsys.readouterr().out


def test_an_option_the_method_does_not_take_is_a_clear_error() -> None:
    with pytest.raises(ValueError, match="takes no option 'time_limit'"):
        solve(linear_graph(3), None, method="chen_sqrtn", time_limit=5)
