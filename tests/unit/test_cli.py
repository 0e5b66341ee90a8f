"""The `checkmate` command line and `compare`: output, plan files, and one-line errors with exit status 2."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
import types
from pathlib import Path

import pytest

from checkmate import Graph, Plan, solve
from checkmate.byte_sizes import parse_budget, resolve_budget
from checkmate.cli import main
from checkmate.examples import linear_graph, random_training_graph
from checkmate.experiments.compare import compare, format_table
from checkmate.moved import HostLink
from checkmate.strategies.registry import strategies


@pytest.fixture
def chain_file(tmp_path: Path) -> Path:
    path = tmp_path / "chain.json"
    path.write_text(linear_graph(16).to_json())
    return path


def run(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    status = main(argv)
    captured = capsys.readouterr()
    return status, captured.out, captured.err


def test_solve_prints_cost_peak_and_compute_ratio_and_writes_the_plan(
    chain_file: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "plan.json"
    status, text, _ = run(
        ["solve", str(chain_file), "--budget", "10", "--method", "chen_greedy", "--out", str(out)], capsys
    )
    assert status == 0
    plan = Plan.from_json(out.read_text(), Graph.from_json(chain_file.read_text()))
    assert plan.method == "chen_greedy" and plan.peak_memory <= 10 and plan.budget == 10
    # checkpoint_all costs 33 on a 16-layer chain (2 * 16 + 1 unit-cost nodes).
    assert f"cost:     {plan.cost:.6g} ({plan.cost / 33:.3f}x the cost of checkpoint_all, 33)" in text
    assert f"peak:     {plan.peak_memory} B ({plan.peak_memory} bytes)" in text


def test_solve_plans_moves_to_host_memory_from_the_graph_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A graph file with a host link: the plan moves what it cannot hold, the summary says how much, and the plan
    file keeps the moves (loaded again, it simulates to the same cost)."""
    path, out = tmp_path / "linked.json", tmp_path / "plan.json"
    graph = dataclasses.replace(linear_graph(6), host_link=HostLink(0.1, 0.1, overlap=1.0))
    path.write_text(graph.to_json())
    status, text, _ = run(["solve", str(path), "--budget", "5", "--method", "optimal", "--out", str(out)], capsys)
    assert status == 0
    plan = Plan.from_json(out.read_text(), Graph.from_json(path.read_text()))
    assert plan.moves.any and plan.cost == pytest.approx(graph.least_cost)
    copies = int(plan.moves.copy_out.sum())
    assert f"moves:    {copies} outputs to host memory" in text and f"host peak {plan.host_peak} B" in text


def test_solve_takes_the_link_as_options(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The same chain without a link in its file, given one on the command line (10 bytes per unit of cost each way,
    all beside compute): the plan moves; a host budget of 1 byte leaves only what fits there; half a link is refused."""
    path = tmp_path / "plain.json"
    path.write_text(linear_graph(6).to_json())
    link = ["--to-host", "10", "--to-device", "10", "--link-overlap", "1"]
    status, text, _ = run(["solve", str(path), "--budget", "5", "--method", "optimal", *link], capsys)
    assert status == 0 and "outputs to host memory" in text
    status, text, _ = run(
        ["solve", str(path), "--budget", "5", "--method", "optimal", *link, "--host-budget", "1"], capsys
    )
    assert status == 0 and "host peak 1 B" in text
    status, _, error = run(["solve", str(path), "--budget", "5", "--to-host", "10"], capsys)
    assert status != 0 and "--to-device" in error


def test_solve_reads_human_budgets(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "big.json"
    path.write_text(linear_graph(4, memory=2**20).to_json())
    status, text, _ = run(["solve", str(path), "--budget", "4MiB", "--method", "chen_sqrtn"], capsys)
    assert status == 0
    assert "peak:     4.00 MiB (4194304 bytes)" in text and "budget:   4.00 MiB (4194304 bytes)" in text


@pytest.mark.parametrize(
    "text,expected",
    [
        ("1000000", 1_000_000),
        ("512MiB", 512 * 2**20),
        ("8GiB", 8 * 2**30),
        ("1e9", 10**9),
        ("2048.0", 2048),
        ("1", 1),
        ("0.6", 0.6),
        ("1.0", 1.0),
        (" .25 ", 0.25),
        ("5e-1", 0.5),
        (4096, 4096),
        (0.5, 0.5),
    ],
)
def test_budgets_read_as_bytes_or_a_fraction(text: object, expected: float) -> None:
    budget = parse_budget(text)  # type: ignore[arg-type]
    assert budget == expected and type(budget) is type(expected)


@pytest.mark.parametrize(
    "text,message",
    [
        ("0", "more than 0 bytes"),
        (0, "more than 0 bytes"),
        ("0.0", "more than 0 bytes"),
        ("0MiB", "more than 0 bytes"),
        ("-1", "more than 0 bytes"),
        ("-0.5", "more than 0 bytes"),
        ("-2GiB", "more than 0 bytes"),
        (-3, "more than 0 bytes"),
        ("1.5", "neither a fraction in (0, 1] of the no-remat peak nor a whole number of bytes"),
        ("2.5e0", "neither a fraction"),
        (1.5, "must lie in (0, 1]"),
        (0.0, "must lie in (0, 1]"),
        (float("nan"), "must lie in (0, 1]"),
        ("inf", "cannot read 'inf' as a budget"),
        ("lots", "cannot read 'lots' as a budget"),
        (True, "a budget must be"),
    ],
)
def test_budgets_that_are_neither_bytes_nor_a_fraction_are_refused(text: object, message: str) -> None:
    with pytest.raises(ValueError) as caught:
        parse_budget(text)  # type: ignore[arg-type]
    assert message in str(caught.value)


def test_a_fraction_is_that_share_of_the_no_remat_peak_rounded_down() -> None:
    assert resolve_budget("0.6", 1001) == 600
    assert resolve_budget(1.0, 1001) == 1001
    assert resolve_budget("1.0", 1001) == 1001
    assert resolve_budget("1", 1001) == 1, "digits alone are bytes"
    assert resolve_budget("1KiB", 1001) == 1024


@pytest.mark.parametrize("fraction", ["0.6", "1.0", "0.75"])
def test_solve_takes_a_fraction_of_the_no_remat_peak(
    chain_file: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], fraction: str
) -> None:
    graph = Graph.from_json(chain_file.read_text())
    peak = solve(graph, None).peak_memory
    expected = int(float(fraction) * peak)
    out = tmp_path / "plan.json"
    status, text, _ = run(
        ["solve", str(chain_file), "--budget", fraction, "--method", "chen_greedy", "--out", str(out)], capsys
    )
    assert status == 0
    plan = Plan.from_json(out.read_text(), graph)
    assert plan.budget == expected and plan.peak_memory <= expected
    assert f"budget:   {expected} B ({expected} bytes; {float(fraction):g} of the checkpoint_all peak)" in text


def test_compare_takes_a_fraction_and_bytes_alike(chain_file: Path, capsys: pytest.CaptureFixture[str]) -> None:
    graph = Graph.from_json(chain_file.read_text())
    budget = int(0.6 * solve(graph, None).peak_memory)
    expected = {row.method: row.peak_memory for row in compare(graph, budget, ["chen_sqrtn", "griewank"])}
    for given in ("0.6", str(budget)):
        status, text, _ = run(
            ["compare", str(chain_file), "--budget", given, "--methods", "chen_sqrtn,griewank"], capsys
        )
        lines = text.strip().splitlines()
        assert status == 0 and lines[0].split()[0] == "method"
        if given == "0.6":  # the bytes the fraction came to, under the table
            assert lines.pop() == f"budget: {budget} B ({budget} bytes; 0.6 of the checkpoint_all peak)"
        # Columns: method, cost, compute ratio, peak (two cells: "8 B"), peak bytes, time, status.
        assert {line.split()[0]: int(line.split()[5]) for line in lines[1:]} == expected


@pytest.mark.parametrize("command", ["solve", "compare"])
@pytest.mark.parametrize(
    "budget,message",
    [
        ("0", "more than 0 bytes"),
        ("-0.5", "more than 0 bytes"),
        ("-1", "more than 0 bytes"),
        ("1.5", "neither a fraction in (0, 1]"),
    ],
)
def test_bad_budgets_give_one_line_errors(
    chain_file: Path, capsys: pytest.CaptureFixture[str], command: str, budget: str, message: str
) -> None:
    status, text, error = run([command, str(chain_file), f"--budget={budget}"], capsys)
    assert status == 2 and text == ""
    assert message in error and error.count("\n") == 1 and error.startswith(f"checkmate {command}: error:")


def test_sweep_still_chooses_its_own_budgets(chain_file: Path, capsys: pytest.CaptureFixture[str]) -> None:
    status, _, error = run(["sweep", str(chain_file), "--budget", "0.6"], capsys)
    assert status == 2 and "use --points instead of --budget" in error


def test_methods_lists_every_registered_method_on_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    status, text, _ = run(["methods"], capsys)
    lines = text.strip().splitlines()
    assert status == 0 and len(lines) == len(strategies())
    for line, strategy in zip(lines, strategies(), strict=True):
        assert line.split()[0] == strategy.name and strategy.description in line


def test_compare_prints_a_row_per_method(chain_file: Path, capsys: pytest.CaptureFixture[str]) -> None:
    status, text, _ = run(["compare", str(chain_file), "--budget", "10", "--methods", "chen_sqrtn,griewank"], capsys)
    lines = text.strip().splitlines()
    assert status == 0 and lines[0].split()[0] == "method"
    assert [line.split()[0] for line in lines[1:]] == ["chen_sqrtn", "griewank"]


def test_compare_rows_compute_ratio_and_errors() -> None:
    graph = linear_graph(9)
    rows = compare(graph, 7, ["checkpoint_all", "chen_sqrtn", "griewank"], options={"slots": 2, "time_limit": 1})
    by_name = {row.method: row for row in rows}
    assert by_name["checkpoint_all"].status == "error" and "needs at least 11 B" in str(by_name["checkpoint_all"].error)
    assert by_name["chen_sqrtn"].compute_ratio == pytest.approx(by_name["chen_sqrtn"].cost / 19)
    assert by_name["griewank"].peak_memory is not None and by_name["griewank"].peak_memory <= 5  # slots=2 reached it
    unlimited = compare(graph, None, ["checkpoint_all"])
    assert unlimited[0].compute_ratio == 1.0 and unlimited[0].peak_memory == 11
    table = format_table(rows)
    assert "error: checkpoint_all needs at least" in table and "1.000x" not in table


def test_compare_refuses_unknown_methods() -> None:
    with pytest.raises(ValueError, match="unknown method 'nope'"):
        compare(linear_graph(3), None, ["nope"])


@pytest.mark.parametrize(
    "nodes,message",
    [
        ([{"name": "a", "cost": 1, "memory": 1, "inputs": [1]}, {"name": "b", "cost": 1, "memory": 1}], "comes later"),
        ([{"name": "a", "cost": 1, "memory": 1, "inputs": [0]}], "cycle"),
        ([{"name": "a", "cost": 1, "memory": -4}], "memory must be"),
        ([{"name": "a", "cost": -1, "memory": 4}], "cost must be"),
        ([], "no nodes"),
    ],
    ids=["forward-reference", "self-cycle", "negative-memory", "negative-cost", "empty"],
)
def test_bad_graphs_give_one_line_errors(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], nodes: list[dict[str, object]], message: str
) -> None:
    path = tmp_path / "bad.json"
    path.write_text(json.dumps({"nodes": nodes}))
    status, text, error = run(["solve", str(path), "--method", "chen_sqrtn"], capsys)
    assert status == 2 and text == ""
    assert message in error and error.count("\n") == 1 and "Traceback" not in error


@pytest.mark.parametrize(
    "arguments,message",
    [
        (["--budget", "3", "--method", "chen_sqrtn"], "chen_sqrtn needs at least"),
        (["--budget", "lots"], "cannot read 'lots' as a budget"),
        (["--method", "nope"], "unknown method 'nope'"),
        (["--method", "griewank", "--option", "slots=2", "--option", "speed=9"], "takes no option 'speed'"),
    ],
)
def test_unusable_requests_give_one_line_errors(
    chain_file: Path, capsys: pytest.CaptureFixture[str], arguments: list[str], message: str
) -> None:
    status, _, error = run(["solve", str(chain_file), *arguments], capsys)
    assert status == 2 and message in error and error.count("\n") == 1


def test_a_missing_graph_file_is_a_one_line_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    status, _, error = run(["compare", str(tmp_path / "absent.json")], capsys)
    assert status == 2 and "absent.json" in error


def test_griewank_on_a_branching_graph_says_what_to_use(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "branching.json"
    path.write_text(random_training_graph(8, seed=1, skip_probability=0.9).to_json())
    status, _, error = run(["solve", str(path), "--method", "griewank"], capsys)
    assert status == 2 and "chen_greedy_linear" in error


def test_capture_hands_its_arguments_to_the_capture_module(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    calls: list[tuple[object, ...]] = []
    fake = types.ModuleType("checkmate.cli.capture")
    fake.run_capture = lambda *arguments: calls.append(arguments) or 0  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "checkmate.cli.capture", fake)
    status, _, _ = run(
        ["capture", "models:resnet", "--out", "g.json", "--cost-model", "flops", "--max-nodes", "50"], capsys
    )
    assert status == 0 and calls == [("models:resnet", "g.json", "flops", 50, "whole_step")]
    run(["capture", "models:resnet", "--out", "g.json", "--gradient-memory", "when_made"], capsys)
    assert calls[-1] == ("models:resnet", "g.json", "profile", None, "when_made")


def test_python_dash_m_runs_the_command_line() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "checkmate", "methods"], capture_output=True, text=True, timeout=60, check=False
    )
    assert result.returncode == 0 and "chen_greedy_linear" in result.stdout
