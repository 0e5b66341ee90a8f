"""The benchmarks' stored rows (`benchmarks/rows.py`) and the peers' summary of means (`benchmarks/peers_report.py`):
tables printed from a file measure nothing, a run that stops keeps the rows it measured, `--merge` keeps the
stored rows of other keys, and a level where ours has no plan is counted in the summary, not left out of it unsaid."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parents[2] / "benchmarks"))
from peers_report import Row as PeerRow
from peers_report import ratio_summary
from rows import Stored, add_row_arguments, measure_or_load, read_rows


def _arguments(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_row_arguments(parser)
    return parser.parse_args(list(argv))


def _render(stored: Stored) -> str:
    return "\n".join(f"{row['n']}: {row['value']}" for row in stored.rows)


def test_from_json_prints_the_stored_rows_and_measures_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "rows.json"

    def measure() -> Iterator[dict[str, int]]:
        yield {"n": 1, "value": 10}
        yield {"n": 2, "value": 20}

    measure_or_load(_arguments("--out", str(path)), "unused", measure, _render)
    measured = capsys.readouterr().out

    def must_not_run() -> Iterator[dict[str, int]]:
        raise AssertionError("--from-json measured")

    stored = measure_or_load(_arguments("--from-json", str(path)), "unused", must_not_run, _render)
    assert capsys.readouterr().out == measured == "1: 10\n2: 20\n"
    assert stored.environment["command"].startswith(".venv/bin/python")
    assert "finished" in stored.environment


def test_a_run_that_stops_keeps_the_rows_it_measured(tmp_path: Path) -> None:
    path = tmp_path / "rows.json"

    def measure() -> Iterator[dict[str, int]]:
        yield {"n": 1, "value": 10}
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        measure_or_load(_arguments("--out", str(path)), "unused", measure, _render)
    assert read_rows(path).rows == [{"n": 1, "value": 10}]


def test_out_without_a_path_means_the_named_file_under_results(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setattr("rows.RESULTS", tmp_path)
    measure_or_load(_arguments("--out"), "some_benchmark", lambda: iter([{"n": 1, "value": 1}]), _render)
    assert read_rows(tmp_path / "some_benchmark.json").rows == [{"n": 1, "value": 1}]


def _peer(peak_mib: float, ms: float, config: str) -> PeerRow:
    return PeerRow(model="VGG", tool="torch.compile", config=config, measured_peak=int(peak_mib * 2**20), step_ms=ms)


def test_a_level_where_ours_has_no_plan_counts_in_the_summary() -> None:
    fitting, below = _peer(20.0, 40.0, "budget 1"), _peer(16.0, 30.0, "budget 0")
    ours_fit = PeerRow(
        model="VGG", tool="ours (optimal)", config="at 20", measured_peak=int(19.0 * 2**20), step_ms=20.0,
        matched=[fitting.label],
    )  # fmt: skip
    ours_none = PeerRow(
        model="VGG", tool="ours (optimal)", config="at 16", note="infeasible (smallest budget 18.00 MiB)",
        matched=[below.label],
    )  # fmt: skip
    summary = ratio_summary([fitting, below, ours_fit, ours_none])
    line = summary.splitlines()[-1]
    assert line.startswith("| ours (optimal) | torch.compile | 1 of 2 | 0.50 |")
    assert line.endswith("| VGG: 16.00 |")


def _merging_arguments(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_row_arguments(parser, merge_key="n")
    return parser.parse_args(list(argv))


def test_merge_keeps_the_stored_rows_of_other_keys_and_replaces_the_same_key(tmp_path: Path) -> None:
    path = tmp_path / "rows.json"
    measure_or_load(
        _arguments("--out", str(path)), "unused", lambda: iter([{"n": 1, "value": 10}, {"n": 2, "value": 20}]), _render
    )
    earlier = read_rows(path).environment

    def measure() -> Iterator[dict[str, int]]:
        yield {"n": 2, "value": 22}
        yield {"n": 3, "value": 30}

    stored = measure_or_load(_merging_arguments("--out", str(path), "--merge"), "unused", measure, _render)
    expected = [{"n": 1, "value": 10}, {"n": 2, "value": 22}, {"n": 3, "value": 30}]
    assert stored.rows == read_rows(path).rows == expected
    assert read_rows(path).environment["merged_with"] == earlier
    measure_or_load(_merging_arguments("--out", str(path), "--merge"), "unused", lambda: iter([]), _render)
    assert read_rows(path).rows == expected


def test_without_merge_out_replaces_the_file_and_merge_needs_out(tmp_path: Path) -> None:
    path = tmp_path / "rows.json"
    measure_or_load(_arguments("--out", str(path)), "unused", lambda: iter([{"n": 1, "value": 10}]), _render)
    measure_or_load(_merging_arguments("--out", str(path)), "unused", lambda: iter([{"n": 2, "value": 20}]), _render)
    assert read_rows(path).rows == [{"n": 2, "value": 20}]
    assert "merged_with" not in read_rows(path).environment
    with pytest.raises(SystemExit, match="give --out too"):
        measure_or_load(_merging_arguments("--merge"), "unused", lambda: iter([{"n": 3, "value": 30}]), _render)
    with pytest.raises(SystemExit):
        _arguments("--merge")
