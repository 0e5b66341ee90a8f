"""Proven bounds, each in one module:

* `floor`: the activation floor, a budget below which no schedule exists (instant);
* `relaxation`: the paper's LP relaxation, a lower bound on cost (and the point `approx` rounds);
* `retention`: the retention bound, a lower bound on cost for graphs too large for the LP (its gaps and rows in
  `gaps`, and the input cover that charges a recomputation for its dead inputs in `input_cover`);
* `closure`: the closure bound, a lower bound on cost from the stage where memory binds (what crosses it is held
  there or rebuilt after it, with every input it is rebuilt from);
* `moved_closure`: the closure bound where values may also move to host memory (a crossing value may be away, within
  what the link carries in the time the step has);
* `peak`: a bracket of the smallest feasible budget (the peak-minimising MILP).
"""

from checkmate.bounds.closure import ClosureBound, closure_bound
from checkmate.bounds.floor import activation_floor
from checkmate.bounds.moved_closure import moved_closure_bound
from checkmate.bounds.peak import BudgetRange, peak_range
from checkmate.bounds.relaxation import Relaxation, relaxation, relaxation_bound
from checkmate.bounds.retention import RetentionBound, retention_bound

__all__ = [
    "BudgetRange",
    "ClosureBound",
    "Relaxation",
    "RetentionBound",
    "activation_floor",
    "closure_bound",
    "moved_closure_bound",
    "peak_range",
    "relaxation",
    "relaxation_bound",
    "retention_bound",
]
