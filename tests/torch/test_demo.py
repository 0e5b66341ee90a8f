"""`make demo` runs `checkmate.demo`; its code path, with a method that needs no solver time, on every test run."""

from __future__ import annotations

import copy
from collections.abc import Sequence
from contextlib import AbstractContextManager

import pytest
import torch

import checkmate.training.compiled
from checkmate import demo, zoo
from checkmate.byte_sizes import parse_bytes
from checkmate.execute import PeakMeter


def test_demo_trains_bit_identical_to_eager_and_reports_measured_figures(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, tmp_path: object
) -> None:
    """The step's meter reads the CPU allocator here (kernel scratch included), and the plan counts profiled scratch."""
    monkeypatch.setenv("CHECKMATE_CACHE_DIR", str(tmp_path))
    real_measure = checkmate.training.compiled.measure_peak

    def allocator_meter(
        device: torch.device, baseline: Sequence[torch.Tensor], *, allocator: bool
    ) -> AbstractContextManager[PeakMeter]:
        return real_measure(device, baseline, allocator=True)

    monkeypatch.setattr(checkmate.training.compiled, "measure_peak", allocator_meter)
    demo.main(["--method", "chen_greedy", "--budget", "0.6", "--steps", "2", "--cost-model", "profile"])
    out = capsys.readouterr().out
    assert out.count("gradients and buffers bit-identical to eager") == 2
    for label in ("planned peak", "measured peak", "eager peak", "measured extra time", "against eager"):
        assert label in out, f"the report lacks {label!r}:\n{out}"
    figures = {line[:19].strip(): line[19:].split()[:2] for line in out.splitlines() if line[:19].strip()}
    names = ("planned peak", "measured peak", "budget")
    planned, measured, budget = (parse_bytes("".join(figures[name])) for name in names)
    assert 0.8 * planned <= measured <= planned <= budget, figures


def test_the_verdict_flags_a_gradient_set_on_one_side_only() -> None:
    """A `.grad` that is None in one model and set in the other is a difference no number shows."""
    model, _, _ = zoo.mlp(batch_size=2)
    reference = copy.deepcopy(model)
    for parameter in model.parameters():
        parameter.grad = torch.zeros_like(parameter)
    for parameter in list(reference.parameters())[1:]:
        parameter.grad = torch.zeros_like(parameter)
    difference, one_sided = demo._largest_difference(model, reference)
    assert difference == 0.0 and one_sided == ["0.weight"]
    assert "one side only for 0.weight" in demo._verdict(difference, one_sided)
    assert demo._verdict(0.0, []) == "bit-identical to eager"
