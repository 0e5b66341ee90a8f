"""The search's policy in one place: size thresholds, time shares and tolerances, one name per setting.

Time shares are fractions of the time a search has left when it starts a phase (`SearchControl.share`); a phase that
finishes early leaves the rest to the next.
"""

from __future__ import annotations

from dataclasses import dataclass

from checkmate.milp.backends.policy import solver_time_limit, too_little_time


@dataclass(frozen=True)
class SearchPolicy:
    """How `optimal` and `approx` spend their time.

    Attributes:
        exact_nodes: the largest graph solved as one MILP (`optimal`) or rounded as one LP (`approx`); larger graphs
            go through a coarse graph (`checkmate.strategies.large_graph`). HiGHS proves chains and real graphs of
            about this size within minutes (BENCHMARKS.md, "MILP and LP rounding on small graphs"); on graphs twice
            as large it does not improve on its warm start in useful time.
        coarse_nodes: nodes of that coarse graph. SCIP (in the portfolio that backend="auto" runs) proves a
            transformer's coarse MILP of this size optimal where HiGHS alone does not improve on its warm start
            (`benchmarks/investigations/large_graph_parts.py`).
        starts_share: the starting plans and the retention bound (`checkmate.strategies.starts`) on a graph solved
            exactly.
        large_starts_share: the same on a large graph, before the coarse graph.
        baseline_improvement_share: of the starting plans' time, what `hold_more` may spend on the best baseline.
        retention_share: of the starting plans' time left, what the retention bound may take (at least
            `retention_minimum` seconds).
        closure_share: of what is left after it, what the closure bound may take (at least `retention_minimum`
            seconds, which is enough on the graph set's largest graphs).
        moved_bound_share: on a graph with a host link, of the time the search has left after the starts that
            recompute only, what the closure bound with moves (`checkmate.bounds.moved_closure`) may take.
        moved_starts_share: on a graph with a host link, of the time the search has left after the other starts, what
            the starts that recompute less and move values to fit may take (`checkmate.strategies.offload_starts`).
        rounding_share: what `approx` may take inside `optimal` before the MILP (its LP is also the LP bound).
        held_share: on a graph with fetched values, what the MILP keeping every one of them may take before the
            rounding (`checkmate.strategies.milp_search`).
        relaxation_share: what the first LP of `approx` (the lower bound, also rounded at ε = 0) may take: the LPs at
            the other ε are as large, so one that does not finish in time is not helped by leaving them more.
        coarse_share: what the coarse graph's MILP or LP rounding may take; the rest goes to expanding and improving.
        refine_factor: each finer coarse graph of a large graph's search has this many times the nodes of the one
            before (`checkmate.strategies.large_graph`, step 6).
        refine_minimum: the least time left, in seconds, for which a finer coarse graph is tried.
        final_bound_share: on a large graph whose retention bound did not finish within the starts' share, what
            `swap_holds` leaves of the time to a last, longer solve of it (a retention bound stopped early can be far
            weaker than the one a few more seconds prove).
        load_seconds_per_variable: an LP or MILP is not handed to a solver with less time left than this times its
            variables. HiGHS loads and presolves these models without checking its clock, for seconds on the LP of a
            coarse graph whatever its limit; SCIP is slower still. A solve given less time overruns the caller's
            limit and rarely improves on its warm start. A solve given more gets that load time less as its own limit.
        cost_tolerance: a plan is cheaper than another, or meets a bound, only by more than this (cost units).
        solver_tolerance: how far a solver's answer may be off its model (a warm start's violation, an objective).
    """

    exact_nodes: int = 160
    coarse_nodes: int = 150
    starts_share: float = 0.15
    large_starts_share: float = 0.3
    baseline_improvement_share: float = 0.5
    retention_share: float = 0.3
    retention_minimum: float = 1.0
    closure_share: float = 0.5
    moved_bound_share: float = 0.15
    moved_starts_share: float = 0.9
    rounding_share: float = 0.8
    held_share: float = 0.4
    relaxation_share: float = 0.8
    coarse_share: float = 0.5
    final_bound_share: float = 0.3
    refine_factor: float = 1.5
    refine_minimum: float = 10.0
    load_seconds_per_variable: float = 1 / 30_000
    cost_tolerance: float = 1e-9
    solver_tolerance: float = 1e-6

    def cheaper(self, cost: float, than: float) -> bool:
        """Whether `cost` is lower than `than` by more than the tolerance."""
        return cost < than - self.cost_tolerance

    def too_little_time(self, remaining: float | None, num_variables: int) -> bool:
        """Whether `remaining` seconds are too few to hand a model of `num_variables` variables to a solver."""
        return too_little_time(remaining, num_variables, self.load_seconds_per_variable)

    def solver_time_limit(self, remaining: float | None, num_variables: int) -> float | None:
        """The time limit to give a solver of a model of `num_variables` variables when `remaining` seconds are
        left: what is left after loading it, which the solver does outside its own clock."""
        return solver_time_limit(remaining, num_variables, self.load_seconds_per_variable)

    def meets(self, cost: float, bound: float, gap: float = 0.0) -> bool:
        """Whether a plan of `cost` is proven within the relative `gap` of the lower `bound`."""
        return cost <= bound * (1.0 + gap) + self.cost_tolerance


POLICY = SearchPolicy()
