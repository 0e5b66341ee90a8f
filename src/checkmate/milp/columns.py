"""Numbering the MILP's variables: one column per true entry of a mask."""

from __future__ import annotations

import numpy as np


def numbered(mask: np.ndarray, first: int) -> np.ndarray:
    """int64 of `mask`'s shape: consecutive column numbers from `first` where `mask` holds, -1 elsewhere."""
    columns = np.full(mask.shape, -1, dtype=np.int64)
    columns[mask] = first + np.arange(int(mask.sum()))
    return columns
