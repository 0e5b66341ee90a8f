"""`checkmate.max_batch` and `checkmate max-batch` on small zoo models: the size found fits and the next does not, and
a step compiled at that size runs within the memory."""

from __future__ import annotations

import math
from collections.abc import Iterator

import pytest

import checkmate
from checkmate import InfeasibleBudget, solve, zoo
from checkmate.cli import main
from checkmate.torch_capture.fake_factory import fake_graph_at
from checkmate.units import parse_bytes

SMALL_VGG = {"image_size": 16, "width": 4}


@pytest.fixture(autouse=True)
def plan_cache_directory(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("CHECKMATE_CACHE_DIR", str(tmp_path_factory.mktemp("plans")))
        yield


def test_a_step_compiled_at_the_batch_size_found_runs_within_the_memory() -> None:
    memory = parse_bytes("4MiB")
    result = checkmate.max_batch(zoo.vgg, "4MiB", method="optimal", factory_options=SMALL_VGG, start=128, time_limit=10)
    assert result.batch_size > 128 and result.plan.peak_memory <= memory
    following = next(attempt for attempt in result.attempts if attempt.batch_size == result.batch_size + 1)
    assert not following.fits
    model, loss_fn, batch = zoo.vgg(batch_size=result.batch_size, **SMALL_VGG)
    step = checkmate.compile(model, loss_fn, batch, budget=memory, cost_model="flops", time_limit=10)
    loss = step(*batch)
    report = step.report()
    assert report.measured_peak is not None and report.measured_peak <= memory, report
    assert math.isfinite(loss.item())


def test_the_command_prints_each_method_against_checkpoint_all(capsys: pytest.CaptureFixture[str]) -> None:
    memory = 135_000
    arguments = ["max-batch", "zoo:mlp", "--memory", str(memory), "--factory-option", "width=64"]
    assert main([*arguments, "--methods", "checkpoint_all,chen_sqrtn", "--max-overhead", "2"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("checkmate.zoo:mlp within") and "at most 2 extra" in lines[0]
    rows = {line.split()[0]: line.split() for line in lines[2:4]}
    everything, sqrtn = int(rows["checkpoint_all"][1]), int(rows["chen_sqrtn"][1])
    assert rows["checkpoint_all"][2] == "1.00x" and rows["chen_sqrtn"][2] == f"{sqrtn / everything:.2f}x"
    graph_at = fake_graph_at(zoo.mlp, width=64)
    assert solve(graph_at(everything), None).peak_memory <= memory < solve(graph_at(everything + 1), None).peak_memory
    assert sqrtn > everything


def test_the_command_reports_a_method_that_fits_nothing(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["max-batch", "zoo:mlp", "--memory", "1KiB", "--methods", "checkpoint_all"]) == 0
    assert "error: checkpoint_all: not even batch size 1 fits" in capsys.readouterr().out
    with pytest.raises(InfeasibleBudget):
        checkmate.max_batch(zoo.mlp, 1024, method="checkpoint_all")
