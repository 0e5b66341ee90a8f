"""`checkmate.max_batch` and `checkmate max-batch`: the batch size found is one that `checkmate.compile`, with its
defaults and the same memory, plans and runs within the memory (as the CPU allocator measures the step, kernel scratch
included), and the next size up does not fit."""

from __future__ import annotations

import gc
from collections.abc import Callable, Iterator

import pytest
import torch
from torch import nn

import checkmate
from checkmate import InfeasibleBudget, solve, zoo
from checkmate.byte_sizes import parse_bytes
from checkmate.cli import main
from checkmate.execute.memory import step_baseline, storage_bytes
from checkmate.torch_capture.allocator import allocator_peak
from checkmate.torch_capture.fake_factory import fake_graph_at

# Three 3x3 convolutions of 16 channels on 16x16 images: 19 planning nodes, and CPU convolution backward holds
# kernel scratch (about 0.3 MiB at batch 8) that fake tensors do not see. Within 1 MiB the search on fake tensors
# names batch 14; with the scratch compile measures, 14 needs 1.21 MiB and 11 is the largest that fits.
MEMORY = "1MiB"


def conv_net(batch_size: int) -> tuple[nn.Module, Callable[..., torch.Tensor], tuple[torch.Tensor]]:
    torch.manual_seed(0)
    model = nn.Sequential(
        nn.Conv2d(3, 16, 3, padding=1),
        nn.BatchNorm2d(16),
        nn.ReLU(),
        nn.Conv2d(16, 16, 3, padding=1),
        nn.ReLU(),
        nn.Conv2d(16, 16, 3, padding=1),
    ).train()
    return model, lambda model, images: model(images).square().mean(), (torch.randn(batch_size, 3, 16, 16),)


@pytest.fixture(autouse=True)
def plan_cache_directory(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("CHECKMATE_CACHE_DIR", str(tmp_path_factory.mktemp("plans")))
        yield


def test_compile_with_its_defaults_trains_the_batch_size_found_within_the_memory() -> None:
    memory = parse_bytes(MEMORY)
    result = checkmate.max_batch(conv_net, MEMORY, start=8, time_limit=10)
    model, loss_fn, batch = conv_net(result.batch_size)
    step = checkmate.compile(model, loss_fn, batch, budget=MEMORY)
    step(*batch)
    for parameter in model.parameters():
        parameter.grad = None
    gc.collect()
    measured = storage_bytes(step_baseline(model, batch)) + allocator_peak(lambda: step(*batch))
    assert measured <= memory, (measured, step.plan.peak_memory)
    assert result.compile_options == {"method": "optimal", "time_limit": 10}
    searched = max(attempt.batch_size for attempt in result.attempts if attempt.fits and not attempt.checked)
    assert result.batch_size < searched, (
        "the fake-tensor answer does not compile within the memory: the check steps down"
    )
    following = next(a for a in result.attempts if a.checked and a.batch_size == result.batch_size + 1)
    assert not following.fits


def test_the_command_prints_each_method_against_checkpoint_all(capsys: pytest.CaptureFixture[str]) -> None:
    memory = 135_000
    arguments = ["max-batch", "zoo:mlp", "--memory", str(memory), "--factory-option", "width=64", "--no-check"]
    assert main([*arguments, "--methods", "checkpoint_all,chen_sqrtn", "--max-extra-forward-passes", "2"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("checkmate.zoo:mlp within") and "at most 2 extra" in lines[0]
    assert "on fake tensors only" in lines[0]
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


def test_the_command_checks_each_answer_by_compiling_the_real_step(capsys: pytest.CaptureFixture[str]) -> None:
    arguments = ["max-batch", "test_max_batch:conv_net", "--memory", MEMORY, "--methods", "checkpoint_all"]
    sizes = []
    for check in ([], ["--no-check"]):
        assert main([*arguments, *check]) == 0
        lines = capsys.readouterr().out.splitlines()
        sizes.append(int(lines[2].split()[1]))
    checked, unchecked = sizes
    assert checked < unchecked, "the kernel scratch the search on fake tensors misses lowers the answer"
    checkmate.compile(*conv_net(checked), budget=MEMORY, method="checkpoint_all")
    with pytest.raises(InfeasibleBudget):
        checkmate.compile(*conv_net(checked + 1), budget=MEMORY, method="checkpoint_all")
