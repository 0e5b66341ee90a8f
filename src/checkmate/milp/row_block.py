"""A block of constraint rows of the MILP, as sparse nonzeros with each row's bounds."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class RowBlock:
    """Rows numbered from 0 within the block: (row, column, value) nonzeros, and lower <= row <= upper."""

    rows: np.ndarray
    cols: np.ndarray
    values: np.ndarray
    lower: np.ndarray
    upper: np.ndarray
