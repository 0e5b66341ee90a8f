"""A `MilpProblem` as a free-format MPS file, the exchange format every MILP solver reads (SCIP's adapter loads it).

Column j is named "c{j}" and row i "r{i}", so a solver's variables map back to the problem's columns by name. Every
column is listed with its objective coefficient (zero included) so that none is dropped, and with explicit bounds, so
that no reader applies its own default to an integer column. Rows free on both sides carry no constraint and are left
out.
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np

from checkmate.milp.problem import MilpProblem


def write_mps(problem: MilpProblem, path: str) -> None:
    """Write `problem` to `path` as free-format MPS."""
    with open(path, "w", encoding="ascii") as file:
        file.writelines(_lines(problem))


def _lines(problem: MilpProblem) -> Iterator[str]:
    lower, upper = problem.row_lower, problem.row_upper
    has_lower, has_upper = np.isfinite(lower), np.isfinite(upper)
    kept = has_lower | has_upper
    equal = has_lower & has_upper & (lower == upper)
    ranged = has_lower & has_upper & ~equal
    kinds = np.where(equal, "E", np.where(has_lower, "G", "L"))
    yield "NAME checkmate\nROWS\n N obj\n"
    yield from (f" {kinds[i]} r{i}\n" for i in np.flatnonzero(kept).tolist())
    yield "COLUMNS\n"
    A = problem.A.tocsc()
    integer = problem.integer.astype(bool)
    for j in range(problem.num_variables):
        if integer[j] and (j == 0 or not integer[j - 1]):
            yield f" M{j} 'MARKER' 'INTORG'\n"
        yield f" c{j} obj {float(problem.c[j])!r}\n"
        rows = A.indices[A.indptr[j] : A.indptr[j + 1]].tolist()
        values = A.data[A.indptr[j] : A.indptr[j + 1]].tolist()
        yield from (f" c{j} r{i} {value!r}\n" for i, value in zip(rows, values, strict=True) if kept[i])
        if integer[j] and (j + 1 == problem.num_variables or not integer[j + 1]):
            yield f" N{j} 'MARKER' 'INTEND'\n"
    yield "RHS\n"
    rhs = np.where(has_lower, lower, upper)
    yield from (f" rhs r{i} {float(rhs[i])!r}\n" for i in np.flatnonzero(kept).tolist())
    if ranged.any():
        yield "RANGES\n"
        yield from (f" rng r{i} {float(upper[i] - lower[i])!r}\n" for i in np.flatnonzero(ranged).tolist())
    yield "BOUNDS\n"
    for j, (low, high) in enumerate(zip(problem.col_lower.tolist(), problem.col_upper.tolist(), strict=True)):
        if low == high:
            yield f" FX bnd c{j} {low!r}\n"
            continue
        yield f" MI bnd c{j}\n" if low == -np.inf else f" LO bnd c{j} {low!r}\n"
        if high != np.inf:
            yield f" UP bnd c{j} {high!r}\n"
        elif low == -np.inf:
            yield f" PL bnd c{j}\n"
    yield "ENDATA\n"
