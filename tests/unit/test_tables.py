"""Table 2, solve times and the sweep table over hand-made sweep rows, the rows' JSON, and `checkmate table2`."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from checkmate.cli import main
from checkmate.experiments.sweep import SweepRow, rows_from_json, rows_to_json
from checkmate.experiments.tables import approximation_ratios, format_sweep, format_table2, solve_times


def row(model: str, method: str, budget: int, cost: float | None, **fields: object) -> SweepRow:
    settings: dict[str, object] = {
        "peak_memory": None if cost is None else budget,
        "compute_ratio": None if cost is None else cost / 80,
        "status": "feasible" if cost is not None else "infeasible",
        "seconds": 1.0,
        "nodes": 7,
        "variables": 99,
    }
    settings.update(fields)
    return SweepRow(model, method, budget, cost, **settings)  # type: ignore[arg-type]


ROWS = [
    row("a", "optimal", 10, 100.0, status="optimal", seconds=4.0, gap=0.0),
    row("a", "optimal", 20, 80.0, status="optimal", seconds=2.0, gap=0.0),
    row("a", "optimal", 5, None, seconds=9.0),
    row("a", "approx", 10, 110.0, gap=0.05),
    row("a", "approx", 20, 80.0, gap=0.0),
    row("a", "approx", 5, 150.0),  # a plan where optimal found none: no ratio
    row("a", "chen_greedy", 10, None),
    row("a", "chen_greedy", 20, 88.0),
    row("a", "checkpoint_all", 20, 80.0),
    row("b", "chen_greedy", 20, 50.0),  # no optimal rows: not in Table 2
]


def test_table2_is_the_geometric_mean_of_the_ratios_where_both_have_a_plan() -> None:
    ratios = {(ratio.model, ratio.method): ratio for ratio in approximation_ratios(ROWS)}
    assert set(ratios) == {("a", "approx"), ("a", "chen_greedy")}  # not the reference, checkpoint_all, or model b
    approx = ratios["a", "approx"]
    assert approx.budgets == 2 and approx.geomean == pytest.approx(math.sqrt(1.1)) and approx.maximum == 1.1
    greedy = ratios["a", "chen_greedy"]
    assert greedy.budgets == 1 and greedy.geomean == pytest.approx(1.1)
    text = format_table2(approximation_ratios(ROWS))
    assert text.splitlines()[0].split() == ["model", "approx", "chen_greedy"]
    assert text.splitlines()[1].split() == ["a", "1.05x", "(2)", "1.10x", "(1)"]


def test_table2_takes_another_reference_and_chosen_methods() -> None:
    (ratio,) = approximation_ratios(ROWS, reference="approx", methods=["optimal"])
    assert (ratio.method, ratio.budgets) == ("optimal", 2)
    assert ratio.geomean == pytest.approx(math.sqrt(100 / 110))


def test_solve_times_count_plans_proofs_and_gaps() -> None:
    times = {(entry.model, entry.method): entry for entry in solve_times(ROWS)}
    optimal = times["a", "optimal"]
    assert (optimal.nodes, optimal.variables, optimal.budgets, optimal.plans, optimal.proven) == (7, 99, 3, 2, 2)
    assert (optimal.median_seconds, optimal.max_seconds, optimal.max_gap) == (4.0, 9.0, 0.0)
    assert times["a", "approx"].max_gap == 0.05 and times["a", "chen_greedy"].max_gap is None


def test_the_sweep_table_marks_missing_plans_and_proofs() -> None:
    lines = format_sweep(ROWS).splitlines()
    assert lines[0] == "a (7 nodes)"
    header, *body = lines[1:5]
    assert header.split() == ["budget", "bytes", "optimal", "approx", "chen_greedy", "checkpoint_all"]
    assert body[1].split() == ["10", "B", "10", "1.250x*", "1.375x", "-", "-"]
    assert body[2].split() == ["20", "B", "20", "1.000x*", "1.000x", "1.100x", "1.000x"]


def test_rows_survive_json_and_bad_json_says_what_to_write(tmp_path: Path) -> None:
    assert rows_from_json(rows_to_json(ROWS)) == ROWS
    with pytest.raises(ValueError, match=r"checkmate sweep \.\.\. --out rows\.json"):
        rows_from_json('{"method": "optimal"}')


def test_table2_command_reads_saved_rows(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "rows.json"
    path.write_text(rows_to_json(ROWS))
    assert main(["table2", str(path)]) == 0
    text = capsys.readouterr().out
    assert "1.05x (2)" in text and "a      optimal" in text
    assert main(["table2", str(path), "--reference", "no_such_method"]) == 0
    assert "sweep with no_such_method among --methods" in capsys.readouterr().out
