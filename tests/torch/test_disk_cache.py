"""compile and its disk caches: off means no file, a cache that cannot be written or read never costs the plan, a
damaged profile is named and measured again, a saved plan over the budget is refused, and profiling prints nothing."""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

import checkmate
from checkmate import InvalidSchedule, zoo
from checkmate.torch_capture.allocator import allocator_peak


@pytest.fixture
def cache_directory(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    directory = tmp_path / "cache"
    monkeypatch.setenv("CHECKMATE_CACHE_DIR", str(directory))
    yield directory


def _compile(**options: object) -> checkmate.CompiledStep:
    model, loss_fn, batch = zoo.mlp(batch_size=4, width=8)
    return checkmate.compile(model, loss_fn, batch, budget=1.0, method="checkpoint_all", **options)  # type: ignore[arg-type]


def test_cache_false_writes_nothing_even_with_profiled_costs(cache_directory: Path) -> None:
    _compile(cost_model="profile", cache=False)
    assert not cache_directory.exists() or list(cache_directory.rglob("*")) == []
    _compile(cost_model="profile")
    assert list(cache_directory.rglob("*.json")), "with the cache on, the same compile writes its caches"


@pytest.mark.parametrize("cache", [True, False])
def test_an_unwritable_cache_directory_is_a_warning_never_a_lost_plan(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture, cache: bool
) -> None:
    (tmp_path / "a file").write_text("not a directory")
    monkeypatch.setenv("CHECKMATE_CACHE_DIR", str(tmp_path / "a file" / "cache"))  # unwritable, even for root
    with caplog.at_level(logging.WARNING, logger="checkmate"):
        step = _compile(cost_model="profile", cache=cache)
    assert step.plan.peak_memory > 0
    assert ("cannot write" in caplog.text) == cache, "said when caching was asked for, silent when it was not"


def test_a_damaged_profile_is_named_removed_and_measured_again(
    cache_directory: Path, caplog: pytest.LogCaptureFixture
) -> None:
    _compile(cost_model="profile")
    profiles = sorted((cache_directory / "profiles").glob("*.json"))
    assert profiles
    timings = profiles[0]
    entries = json.loads(timings.read_text())
    timings.write_text(json.dumps(dict.fromkeys(entries, float("nan"))))  # poisoned: every op costs NaN
    profiles[-1].write_text(profiles[-1].read_text()[:10])  # truncated by a crash
    with caplog.at_level(logging.WARNING, logger="checkmate"):
        step = _compile(cost_model="profile")
    assert str(timings) in caplog.text and str(profiles[-1]) in caplog.text
    assert all(cost == cost for cost in [step.plan.cost, *(node.cost for node in step.graph.nodes)]), "no NaN"
    assert json.loads(timings.read_text()).keys() == entries.keys(), "measured again and cached anew"


def test_load_plan_refuses_a_plan_over_the_steps_budget(tmp_path: Path) -> None:
    model, loss_fn, batch = zoo.mlp(batch_size=8)
    roomy = checkmate.compile(model, loss_fn, batch, budget=1.0, method="checkpoint_all", cost_model="unit")
    path = tmp_path / "plan.json"
    roomy.save_plan(path)
    tight = checkmate.compile(model, loss_fn, batch, budget=0.97, method="optimal", cost_model="unit", time_limit=10)
    assert roomy.plan.peak_memory > tight.plan.budget  # type: ignore[operator]
    with pytest.raises(InvalidSchedule, match="over the budget"):
        tight.load_plan(path)


def test_profiling_memory_prints_nothing(capfd: pytest.CaptureFixture[str]) -> None:
    allocator_peak(lambda: torch.ones(1000) + 1)
    _compile(cost_model="profile", cache=False)
    out, err = capfd.readouterr()
    assert "profiler_start" not in out + err and "profiler_stop" not in out + err and "USDT" not in out + err


def test_what_else_is_written_while_the_profiler_starts_still_shows(
    capfd: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Only Kineto's start and stop markers are dropped: an error written to stderr then is kept."""
    start = torch.profiler.profile.start

    def start_with_an_error(self: torch.profiler.profile) -> None:
        os.write(2, b"ERROR: a real problem\n")
        start(self)

    monkeypatch.setattr(torch.profiler.profile, "start", start_with_an_error)
    allocator_peak(lambda: torch.ones(10))
    assert "ERROR: a real problem" in capfd.readouterr().err
