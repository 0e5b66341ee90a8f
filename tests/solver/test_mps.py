"""The MPS writer (`checkmate.milp.mps`), checked by reading its file back with HiGHS's own MPS reader."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import scipy.sparse as sp

from checkmate.examples import random_training_graph
from checkmate.milp.formulation import encode
from checkmate.milp.mps import write_mps
from checkmate.milp.problem import MilpProblem
from checkmate.milp.scaling import memory_scale

highspy = pytest.importorskip("highspy")


def read_back(path: Path) -> object:
    highs = highspy.Highs()
    highs.setOptionValue("output_flag", False)
    highs.readModel(str(path))
    return highs.getLp()


def every_kind_of_row_and_column() -> MilpProblem:
    """Rows: <=, >=, =, ranged, free; columns: integer runs, continuous, fixed, free, bounded below only."""
    A = sp.csc_array(
        np.array(
            [
                [1.0, 2.0, 0.0, 1.0, 0.0],
                [0.0, 1.0, 3.0, 0.0, 1.0],
                [1.0, 0.0, 0.0, 1.0, 1.0],
                [0.5, 0.5, 0.5, 0.5, 0.5],
                [1.0, 1.0, 1.0, 1.0, 1.0],
            ]
        )
    )
    return MilpProblem(
        c=np.array([1.0, -2.0, 0.0, 0.25, 3.0]),
        A=A,
        row_lower=np.array([-np.inf, 1.0, 2.0, -1.0, -np.inf]),
        row_upper=np.array([4.0, np.inf, 2.0, 5.5, np.inf]),
        col_lower=np.array([0.0, 0.0, 1.5, -np.inf, -2.0]),
        col_upper=np.array([1.0, 7.0, 1.5, np.inf, np.inf]),
        integer=np.array([True, True, False, False, True]),
    )


def test_every_kind_of_row_and_column_reads_back_as_written(tmp_path: Path) -> None:
    problem = every_kind_of_row_and_column()
    write_mps(problem, str(tmp_path / "p.mps"))
    lp = read_back(tmp_path / "p.mps")
    assert np.array_equal(np.asarray(lp.col_cost_), problem.c)
    assert np.array_equal(np.asarray(lp.col_lower_), problem.col_lower)
    assert np.array_equal(np.asarray(lp.col_upper_), problem.col_upper)
    integral = [str(kind).endswith("kInteger") for kind in lp.integrality_]
    assert integral == problem.integer.tolist()
    kept = np.isfinite(problem.row_lower) | np.isfinite(problem.row_upper)  # the free row is left out
    assert np.array_equal(np.asarray(lp.row_lower_), problem.row_lower[kept])
    assert np.array_equal(np.asarray(lp.row_upper_), problem.row_upper[kept])
    lp.a_matrix_.format_ = highspy.MatrixFormat.kColwise
    read = sp.csc_array(
        (np.asarray(lp.a_matrix_.value_), np.asarray(lp.a_matrix_.index_), np.asarray(lp.a_matrix_.start_)),
        shape=(int(kept.sum()), problem.num_variables),
    )
    assert (read != problem.A[kept]).nnz == 0


def test_a_checkmate_milp_reads_back_with_every_column(tmp_path: Path) -> None:
    graph = random_training_graph(6, seed=1)
    scale = memory_scale(graph)
    problem, _ = encode(graph, scale.budget_units(10**6, graph.fixed_memory), scale)
    write_mps(problem, str(tmp_path / "p.mps"))
    lp = read_back(tmp_path / "p.mps")
    assert lp.num_col_ == problem.num_variables and np.array_equal(np.asarray(lp.col_cost_), problem.c)
    assert sum(str(kind).endswith("kInteger") for kind in lp.integrality_) == int(problem.integer.sum())
