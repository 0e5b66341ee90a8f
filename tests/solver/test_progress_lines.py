"""A search shows its progress without any logging set up: a line every `progress_interval` seconds on stderr with
the elapsed time, the best plan's extra compute, the bound and the gap; in the log instead when logging is
configured; nothing with `progress=False` or a level above INFO on the "checkmate" logger."""

from __future__ import annotations

import logging

import pytest
from unconfigured_logging import unconfigured

import checkmate
from checkmate import progress_lines
from checkmate.examples import random_training_graph

GRAPH = random_training_graph(60, seed=0)  # its search runs past the time limit below


def _search(**options: object) -> checkmate.Plan:
    budget = int(0.7 * checkmate.solve(GRAPH, None).peak_memory)
    return checkmate.solve(GRAPH, budget, method="optimal", time_limit=1.0, **options)  # type: ignore[arg-type]


def _lines(err: str) -> list[str]:
    return [line for line in err.splitlines() if line.startswith("checkmate: planning")]


def test_without_logging_set_up_a_search_shows_a_line_every_interval_on_stderr(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with unconfigured():
        plan = _search(progress_interval=0.2)
    lines = _lines(capsys.readouterr().err)
    assert len(lines) >= 2, lines
    assert all("s of 1 s" in line and "extra compute" in line and "bound" in line and "gap" in line for line in lines)
    assert plan.peak_memory <= plan.budget
    assert not progress_lines.log.handlers, "the handler is taken off when the search ends"


def test_progress_false_or_a_level_on_the_checkmate_logger_silences_it(capsys: pytest.CaptureFixture[str]) -> None:
    with unconfigured():
        _search(progress_interval=0.2, progress=False)
        assert not _lines(capsys.readouterr().err)
        logging.getLogger("checkmate").setLevel(logging.WARNING)
        _search(progress_interval=0.2)
        assert not _lines(capsys.readouterr().err)


def test_with_logging_configured_the_lines_go_to_the_log(
    caplog: pytest.LogCaptureFixture, capsys: pytest.CaptureFixture[str]
) -> None:
    with caplog.at_level(logging.INFO, logger="checkmate.progress_lines"):
        _search(progress_interval=0.2)
    assert len([record for record in caplog.records if record.name == "checkmate.progress_lines"]) >= 2
    assert not _lines(capsys.readouterr().err)


def test_a_short_search_shows_nothing_and_bad_intervals_are_refused(capsys: pytest.CaptureFixture[str]) -> None:
    checkmate.solve(GRAPH, None, method="optimal", progress_interval=60.0)
    assert not _lines(capsys.readouterr().err)
    with pytest.raises(checkmate.InvalidArgument, match="progress_interval"):
        _search(progress_interval=0.0)
    with pytest.raises(checkmate.InvalidArgument, match="progress"):
        _search(progress="yes")
