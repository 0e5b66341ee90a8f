"""Runners: local processes give what one process gives, in task order; errors say what to do; a sweep of a graph
file imports no torch."""

from __future__ import annotations

import dataclasses
import math
import subprocess
import sys
from pathlib import Path

import pytest

from checkmate.errors import RunnerUnavailable
from checkmate.examples import random_training_graph
from checkmate.experiments.parallel import LocalRunner, RayRunner, make_runner
from checkmate.experiments.sweep import SweepRow, sweep

BASELINES = ["checkpoint_all", "chen_sqrtn_linear", "chen_greedy", "chen_greedy_linear"]


def without_seconds(rows: list[SweepRow]) -> list[SweepRow]:
    return [dataclasses.replace(row, seconds=0.0) for row in rows]


def test_worker_processes_give_the_rows_one_process_gives_in_task_order() -> None:
    graph = random_training_graph(10, seed=4)
    budgets = [int(graph.fixed_memory + (1 + k) * graph.memory.sum() / 8) for k in range(4)]
    seen: list[SweepRow] = []
    here = sweep(graph, budgets, BASELINES, runner=LocalRunner(workers=1))
    there = sweep(graph, budgets, BASELINES, runner=LocalRunner(workers=2), on_row=seen.append)
    assert without_seconds(there) == without_seconds(here)
    assert sorted(map(id, seen)) == sorted(map(id, there)), "on_row gets every row once"
    assert [(row.budget, row.method) for row in here] == [(b, m) for b in budgets for m in BASELINES]
    assert any(row.cost is not None for row in here) and any(row.cost is None for row in here)


def test_an_error_in_a_worker_reaches_the_caller() -> None:
    assert LocalRunner(workers=2).map(math.sqrt, [4.0, 9.0]) == [2.0, 3.0]
    with pytest.raises(ValueError, match="math domain error"):
        LocalRunner(workers=2).map(math.sqrt, [4.0, -1.0])


def test_runner_settings_are_checked() -> None:
    with pytest.raises(ValueError, match="at least 1"):
        LocalRunner(workers=0)
    with pytest.raises(ValueError, match="leave it out"):
        make_runner(workers=2, ray_address="auto")
    assert make_runner(None, "auto") == RayRunner("auto") and make_runner(3, None) == LocalRunner(3)


def test_ray_missing_says_how_to_install_it(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "ray", None)  # `import ray` raises ImportError
    with pytest.raises(RunnerUnavailable, match=r"pip install 'checkmate-remat\[ray\]'"):
        RayRunner("auto").map(math.sqrt, [1.0])


def test_an_address_where_no_ray_cluster_listens_fails_at_once() -> None:
    pytest.importorskip("ray")
    with pytest.raises(RunnerUnavailable, match=r"nothing answers at 127\.0\.0\.1:1.*ray start --head"):
        RayRunner("127.0.0.1:1").map(math.sqrt, [1.0])


def test_a_sweep_of_a_graph_file_imports_no_torch(tmp_path: Path) -> None:
    path = tmp_path / "graph.json"
    path.write_text(random_training_graph(6, seed=1).to_json())
    code = (
        "import sys\nfrom checkmate.cli import main\n"
        f"assert main(['sweep', {str(path)!r}, '--points', '2', '--methods', 'chen_greedy', '--workers', '2']) == 0\n"
        "assert 'torch' not in sys.modules, 'torch was imported'\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=False)
    assert result.returncode == 0, result.stderr
    assert "2 solves on 2 worker processes" in result.stdout and "graph (13 nodes)" in result.stdout
