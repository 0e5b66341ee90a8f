"""`checkmate sweep` on a model factory: captured on fake tensors at the batch size asked, or the factory's own."""

from __future__ import annotations

from pathlib import Path

import pytest

from checkmate.cli import main
from checkmate.experiments.sweep import rows_from_json


def test_sweep_captures_a_zoo_model_at_the_batch_size_given(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "rows.json"
    common = ["--points", "2", "--methods", "checkpoint_all,chen_greedy", "--workers", "1"]
    assert main(["sweep", "zoo:mlp", "--batch-size", "4", *common, "--out", str(out)]) == 0
    rows = rows_from_json(out.read_text())
    assert {row.model for row in rows} == {"mlp_b4"} and len(rows) == 4
    # At the no-remat peak nothing is recomputed.
    assert rows[-1].method == "chen_greedy" and rows[-1].compute_ratio == 1.0
    assert main(["sweep", "zoo:mlp", "checkmate.zoo:mlp", *common]) == 2  # the same name twice
    assert "two targets are named 'mlp_b8'" in capsys.readouterr().err


def test_a_factory_without_a_batch_size_says_to_give_one(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["sweep", "math:sqrt", "--points", "2"]) == 2
    assert "no default batch_size; give one with --batch-size" in capsys.readouterr().err
