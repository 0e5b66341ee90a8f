"""Proven bounds, each in one module:

* `floor`: the activation floor, a budget below which no schedule exists (instant);
* `relaxation`: the paper's LP relaxation, a lower bound on cost (and the point `approx` rounds);
* `retention`: the retention bound, a lower bound on cost for graphs too large for the LP (its gaps and rows in
  `gaps`, and the input cover that charges a recomputation for its dead inputs in `input_cover`);
* `peak`: a bracket of the smallest feasible budget (the peak-minimising MILP).
"""

from checkmate.bounds.floor import activation_floor
from checkmate.bounds.peak import BudgetRange, peak_range
from checkmate.bounds.relaxation import Relaxation, relaxation, relaxation_bound
from checkmate.bounds.retention import RetentionBound, retention_bound

__all__ = [
    "BudgetRange",
    "Relaxation",
    "RetentionBound",
    "activation_floor",
    "peak_range",
    "relaxation",
    "relaxation_bound",
    "retention_bound",
]
