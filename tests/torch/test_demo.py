"""`make demo` runs `checkmate.demo`; its code path, with a method that needs no solver time, on every test run."""

from __future__ import annotations

import pytest

from checkmate import demo


def test_demo_trains_bit_identical_to_eager_and_reports_measured_figures(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, tmp_path: object
) -> None:
    monkeypatch.setenv("CHECKMATE_CACHE_DIR", str(tmp_path))
    demo.main(["--method", "chen_greedy", "--steps", "2", "--cost-model", "flops"])
    out = capsys.readouterr().out
    assert out.count("gradients and buffers bit-identical to eager") == 2
    for label in ("planned peak", "measured peak", "eager peak", "measured overhead", "against eager"):
        assert label in out, f"the report lacks {label!r}:\n{out}"
