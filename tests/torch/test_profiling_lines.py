"""Profiling a model's ops shows progress as a search does: a line when it starts (how many ops, on which device,
cached for the next compile) and one every `progress_interval` seconds with the pass and the op it is at, on stderr
when no logging is set up; `progress=False` silences them."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn
from unconfigured_logging import unconfigured

import checkmate
from checkmate.torch_capture import profile


def _compile(**options: Any) -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 8), nn.Tanh(), nn.Linear(8, 1))
    checkmate.compile(
        model, lambda m, x: m(x).sum(), (torch.randn(4, 8),), budget=1.0, cost_model="profile", cache=False, **options
    )


def _slow_timer(node: torch.fx.Node, args: Any, kwargs: Any) -> tuple[Any, float]:
    time.sleep(0.002)  # a large model's op; the lines come every 0.05 s below
    return profile._call(node, args, kwargs), 1e-3


def _lines(err: str) -> list[str]:
    return [line for line in err.splitlines() if line.startswith(("checkmate: profiling", "checkmate: measuring"))]


@pytest.fixture
def slow_profiling(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """An empty cache, and ops that take a few milliseconds each to time."""
    monkeypatch.setenv("CHECKMATE_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(profile, "_cpu_timer", _slow_timer)


@pytest.mark.usefixtures("slow_profiling")
def test_profiling_shows_a_first_line_and_then_where_it_is(capsys: pytest.CaptureFixture[str]) -> None:
    with unconfigured():
        _compile(progress_interval=0.05)
    lines = _lines(capsys.readouterr().err)
    assert any(
        line.startswith("checkmate: profiling op times on cpu: ") and "cached for the next compile" in line
        for line in lines
    ), lines
    assert any(" pass " in line and " of at most " in line and ", op " in line for line in lines), lines


@pytest.mark.usefixtures("slow_profiling")
def test_progress_false_silences_profiling(capsys: pytest.CaptureFixture[str]) -> None:
    with unconfigured():
        _compile(progress_interval=0.05, progress=False)
    assert not _lines(capsys.readouterr().err)
