"""Only expected failures become rows or usage errors; a broken plan surfaces as the bug it is.

`InvalidSchedule` and `InvalidGraph` are ValueErrors. `compare`, the sweep and the command line once caught every
ValueError: a baseline that built an invalid schedule showed as an "error" row, or ended the CLI with exit code 2
like a user mistake. The tests inject such a bug into the solve these callers use.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

import checkmate
from checkmate.cli import main
from checkmate.examples import linear_graph
from checkmate.experiments import compare as compare_module
from checkmate.experiments import sweep as sweep_module
from checkmate.experiments.compare import compare
from checkmate.experiments.sweep import SweepTask, solve_task

GRAPH = linear_graph(6)


def _broken_chen(real: Any) -> Any:
    def solve(graph: checkmate.Graph, budget: int | None, method: str = "optimal", **options: Any) -> checkmate.Plan:
        if method == "chen_sqrtn":
            raise checkmate.InvalidSchedule("S[3, 1] is held but was never computed (1c)")
        return real(graph, budget, method=method, **options)

    return solve


def test_compare_reports_infeasible_budgets_as_rows_and_raises_on_a_broken_plan(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    rows = {row.method: row for row in compare(GRAPH, 4, ["checkpoint_all", "chen_sqrtn"])}
    assert rows["checkpoint_all"].status == "error" and "needs at least" in (rows["checkpoint_all"].error or "")
    monkeypatch.setattr(compare_module, "solve", _broken_chen(compare_module.solve))
    with pytest.raises(checkmate.InvalidSchedule, match=r"\(1c\)"):
        compare(GRAPH, 9, ["checkpoint_all", "chen_sqrtn"])


def test_a_sweep_task_raises_on_a_broken_plan(monkeypatch: pytest.MonkeyPatch) -> None:
    infeasible = solve_task(SweepTask("chain", GRAPH, 4, "checkpoint_all"))
    assert infeasible.status == "infeasible"
    monkeypatch.setattr(sweep_module, "solve", _broken_chen(sweep_module.solve))
    with pytest.raises(checkmate.InvalidSchedule):
        solve_task(SweepTask("chain", GRAPH, 9, "chen_sqrtn"))


def test_the_command_line_exits_2_on_user_errors_and_raises_on_a_broken_plan(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "chain.json"
    path.write_text(GRAPH.to_json())
    assert main(["solve", str(path), "--budget", "4", "--method", "checkpoint_all"]) == 2
    assert main(["solve", str(path), "--budget", "lots", "--method", "checkpoint_all"]) == 2
    assert "budget" in capsys.readouterr().err
    monkeypatch.setattr("checkmate.cli.commands.solve", _broken_chen(checkmate.solve))
    with pytest.raises(checkmate.InvalidSchedule):
        main(["solve", str(path), "--budget", "9", "--method", "chen_sqrtn"])
