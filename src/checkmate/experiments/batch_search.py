"""The largest batch size that trains within a memory limit (the paper's Figure 6), by solving at candidate sizes.

    result = checkmate.max_batch(checkmate.zoo.mobilenet, "16GiB", method="optimal", max_extra_forward_passes=1.0)
    result.batch_size, result.plan.cost, result.attempts
    step = checkmate.compile(*checkmate.zoo.mobilenet(batch_size=result.batch_size), budget=result.memory,
                             **result.compile_options)

The paper maximises a batch-size variable inside one MILP with quadratic constraints (its section 6.4), which needs a
day of Gurobi. Here the batch size is searched from outside, in two stages.

1. Search (`search_max_batch`): the step is captured on fake tensors at a candidate size (no activation is
   allocated) and `checkmate.solve` plans it within the memory. The search grows the size until a plan fails, then
   narrows the bracket between the largest size that fit and the smallest that did not, guided by the memory each
   size needed (memory grows about linearly with the batch), with bisection as the fallback. A size whose
   activation floor (`checkmate.bounds.activation_floor`: the fixed memory plus the largest node with its inputs)
   is above the memory fails without a solve. The search assumes that a size fits whenever a larger one does.
2. Check (`check_max_batch`, on by default in `max_batch`): fake tensors run no kernel, so their graphs count no
   kernel scratch (a convolution's backward holds buffers inside itself), which `checkmate.compile` measures with
   its default "profile" cost model and plans for. The answer of the search is an upper bound; the check builds the
   real model at that size and plans it with `checkmate.compile` itself, stepping down (and narrowing) while that
   plan does not fit. The result's `compile_options` are the keywords of `checkmate.compile` (with
   `budget=result.memory`) under which the size was checked to plan within the memory; None when it was not
   checked, and then the size holds only for planning on fake tensors (a compiled step may need more).

`max_extra_forward_passes` is the paper's cost constraint (its eq. 10): a plan fits only if its cost exceeds the cost
without rematerialization (`checkpoint_all`) at that batch size by at most that many forward passes (the summed cost
of the forward nodes); 1.0 is the paper's "at most one extra forward pass". It is counted in forward passes, not as a
ratio, so that it means the same under every cost model (flops in the search, profiled seconds in the check).

The search and the check take functions of the batch size and import no torch; `checkmate.max_batch`
(`checkmate.model_max_batch`, torch) builds them from a model factory.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from checkmate.bounds import activation_floor
from checkmate.byte_sizes import format_bytes, parse_bytes
from checkmate.errors import InfeasibleBudget, InvalidArgument
from checkmate.graph import Graph
from checkmate.plan import Plan
from checkmate.progress import Progress, ProgressCallback
from checkmate.solve import solve
from checkmate.strategies.registry import get_strategy, option_names

log = logging.getLogger(__name__)

REFERENCE = "checkpoint_all"
# The largest batch size tried unless the caller gives another `limit`: a graph whose memory does not grow with the
# batch size (a factory that ignores it) would otherwise double forever.
DEFAULT_LIMIT = 1 << 20

GraphAt = Callable[[int], Graph]


@dataclass(frozen=True)
class Planned:
    """A plan of the step at one batch size and the graph it plans."""

    graph: Graph
    plan: Plan


# Plans the step at a batch size within the memory, or raises InfeasibleBudget (the check: `checkmate.compile`).
PlanAt = Callable[[int], Planned]


@dataclass(frozen=True)
class Attempt:
    """One batch size tried.

    Attributes:
        batch_size: the size.
        fits: whether the method found a plan within the memory (and the cap on extra forward passes).
        reason: why it failed ("" when it fit): the activation floor, the method's error, or the extra compute.
        seconds: wall-clock seconds for this size, capture and solve included.
        cost: the plan's cost when the method found one within the memory, else None.
        peak_memory: that plan's peak in bytes, else None.
        solved: whether the method ran (False when the activation floor ruled the size out).
        checked: whether this size was planned on the real step by `checkmate.compile` (the check), not on fake
            tensors (the search).
    """

    batch_size: int
    fits: bool
    reason: str
    seconds: float
    cost: float | None = None
    peak_memory: int | None = None
    solved: bool = True
    checked: bool = False


@dataclass(frozen=True)
class MaxBatch:
    """The largest batch size a method plans within a memory limit, and its plan.

    Attributes:
        method: the method searched with.
        memory: the memory limit in bytes, fixed memory included.
        max_extra_forward_passes: the cap on extra compute in forward passes, or None.
        batch_size: the largest size found to fit: the next size up failed (within `tolerance` of it: a size
            that failed), or it is `limit`.
        plan: the method's plan at that size (the compiled step's plan when checked).
        graph_size: nodes of the graph at that size.
        compute_ratio: the plan's cost divided by the cost without rematerialization at that size.
        extra_forward_passes: the plan's extra cost over that, in forward passes (what `max_extra_forward_passes`
            caps).
        attempts: every size tried, in order (the search's, then the check's).
        seconds: wall-clock seconds of the whole search and check.
        reached_limit: True when `batch_size` is the search's `limit`: the memory does not bound the batch below it.
        compile_options: the keywords of `checkmate.compile` (besides `budget=memory`) whose plan at `batch_size`
            was checked to fit the memory; None when unchecked: the size then holds for planning on fake tensors,
            which counts no kernel scratch.
    """

    method: str
    memory: int
    max_extra_forward_passes: float | None
    batch_size: int
    plan: Plan
    graph_size: int
    compute_ratio: float
    extra_forward_passes: float
    attempts: tuple[Attempt, ...]
    seconds: float
    reached_limit: bool = False
    compile_options: dict[str, Any] | None = None


def search_max_batch(
    graph_at: GraphAt,
    memory: int | str,
    *,
    method: str = "optimal",
    max_extra_forward_passes: float | None = None,
    start: int = 1,
    limit: int = DEFAULT_LIMIT,
    tolerance: float = 0.0,
    progress: ProgressCallback | None = None,
    **solve_options: Any,
) -> MaxBatch:
    """The largest batch size n for which `method` plans `graph_at(n)` within `memory` bytes (no torch).

    1. Try `start`; step down until a size fits, or grow until one fails: to the first size where the line through
       the memory the last two sizes needed predicts a failure, or double when that line predicts no growth.
       Stepping down goes to where that line (or, with one size tried, memory proportional to the batch size)
       meets the memory, else halves.
    2. When that size failed on its activation floor, find the largest size whose floor fits (graphs only, no
       solve) and solve there once: when the method fits at its floor's limit, that is the answer (it often is for
       `optimal`).
    3. Narrow the bracket, alternating a secant step (on the memory each end needed: the plan's peak, or the
       smallest budget the method said it could meet) with bisection, so sizes whose memory grows linearly take a
       step or two and no search takes more than about twice log2 of the bracket.

    The arguments are those of `max_batch`; `graph_at` is called once per size. The result is unchecked
    (`compile_options` None).

    Raises:
        InfeasibleBudget: not even batch size 1 fits.
        ValueError: a bad argument (unknown method, start outside [1, limit], a negative cap or tolerance).
    """
    budget = parse_bytes(memory)
    get_strategy(method)
    if not 1 <= start <= limit:
        raise InvalidArgument(f"start must lie in [1, limit={limit}], got {start}")
    if max_extra_forward_passes is not None and max_extra_forward_passes < 0:
        raise InvalidArgument(f"max_extra_forward_passes must be >= 0, got {max_extra_forward_passes}")
    if tolerance < 0:
        raise InvalidArgument(f"tolerance is a fraction of the batch size and must be >= 0, got {tolerance}")
    search = _Search(budget, method, max_extra_forward_passes, progress, graph_at=graph_at, solve_options=solve_options)
    fits, fails = search.bracket(start, limit)
    if fails <= limit and search.floor(fails) > budget:
        highest, fails = search.narrow(fits, fails, search.floor_fits, search.floor, gap=1)
        if highest > fits:
            if search.try_size(highest):
                fits = highest
            else:
                fails = highest
    fits, fails = search.narrow(fits, fails, search.try_size, search.needs.get, gap=max(1, int(tolerance * fits)))
    return search.result(fits, reached_limit=fits == limit)


def check_max_batch(
    found: MaxBatch,
    plan_at: PlanAt,
    compile_options: dict[str, Any],
    *,
    tolerance: float = 0.0,
    progress: ProgressCallback | None = None,
) -> MaxBatch:
    """`found` checked with `plan_at` (no torch): the largest size up to `found.batch_size` that `plan_at` plans
    within the memory (and the cap on extra forward passes), searched as `search_max_batch` steps down and narrows.

    Args:
        found: an answer of `search_max_batch`; sizes above it are not tried (the check's memory model counts at
            least what the search's did).
        plan_at: plans the real step at a size, or raises InfeasibleBudget.
        compile_options: the keywords of `checkmate.compile` that `plan_at` plans with, recorded in the result.
        tolerance: as for `search_max_batch`.
        progress: as for `search_max_batch`.

    Raises:
        InfeasibleBudget: not even batch size 1 fits.
    """
    search = _Search(found.memory, found.method, found.max_extra_forward_passes, progress, plan_at=plan_at)
    fits, fails = search.bracket(found.batch_size, found.batch_size)
    fits, fails = search.narrow(fits, fails, search.try_size, search.needs.get, gap=max(1, int(tolerance * fits)))
    checked = search.result(fits, reached_limit=found.reached_limit and fits == found.batch_size)
    return dataclasses.replace(
        checked,
        attempts=found.attempts + checked.attempts,
        seconds=found.seconds + checked.seconds,
        compile_options=dict(compile_options),
    )


class _Search:
    """The state of one search: graphs and plans by size, the sizes tried, the clock (internal).

    It plans a size either by solving `graph_at(size)` (the search, which also rules sizes out by their activation
    floor) or with `plan_at(size)` (the check)."""

    def __init__(
        self,
        budget: int,
        method: str,
        max_extra_forward_passes: float | None,
        progress: ProgressCallback | None,
        *,
        graph_at: GraphAt | None = None,
        solve_options: dict[str, Any] | None = None,
        plan_at: PlanAt | None = None,
    ) -> None:
        self.graph_at = graph_at
        self.plan_at = plan_at
        self.budget = budget
        self.method = method
        self.max_extra_forward_passes = max_extra_forward_passes
        self.progress = progress
        self.solve_options = solve_options or {}
        names = option_names(method)
        self.takes_progress = names is None or "progress" in names
        self.started = time.perf_counter()
        self.attempts: list[Attempt] = []
        self.graphs: dict[int, Graph] = {}
        self.fitted: dict[int, tuple[Planned, float]] = {}  # size -> (plan, cost without rematerialization)
        self.errors: dict[int, InfeasibleBudget] = {}
        self.needs: dict[int, int] = {}  # size -> the memory it needed: a plan's peak, or a budget it said it needs

    def graph(self, size: int) -> Graph:
        assert self.graph_at is not None, "a check plans with plan_at and has no graphs before it plans"
        if size not in self.graphs:
            self._report(f"batch {size}: capturing")
            self.graphs[size] = self.graph_at(size)
        return self.graphs[size]

    def floor(self, size: int) -> int:
        """The activation floor of the graph at `size`: no plan of it peaks lower."""
        return activation_floor(self.graph(size))

    def bracket(self, start: int, limit: int) -> tuple[int, int]:
        """(a size that fits, a larger size that fails or limit + 1): step down from `start` until a size fits, or
        grow from it until one fails."""
        size, fails = start, limit + 1
        while not self.try_size(size):
            if size == 1:
                raise self._nothing_fits()
            fails, size = size, self._below(size, fails if fails <= limit else None)
        if size < start:
            return size, fails
        previous = None
        while size < limit:
            guess = None if previous is None else self._crossing(previous, size, self.needs.get)
            candidate = min(limit, guess + 1 if guess is not None and guess > size else 2 * size)
            if not self.try_size(candidate):
                return size, candidate
            previous, size = size, candidate
        return size, limit + 1

    def _below(self, size: int, larger: int | None) -> int:
        """The next size to try below `size`, which failed: where the line through the memory needed at `size` and
        at `larger` (a larger size that failed) meets the memory, else where memory proportional to the batch size
        would (too high by the fixed memory's share, so it errs towards sizes that fail), else half of `size`."""
        guess = None if larger is None else self._crossing(size, larger, self.needs.get)
        need = self.needs.get(size)
        if guess is None and need is not None and need > self.budget:
            guess = size * self.budget // need
        return min(max(guess if guess is not None else size // 2, 1), size - 1)

    def narrow(
        self, low: int, high: int, fits: Callable[[int], bool], value: Callable[[int], int | None], *, gap: int
    ) -> tuple[int, int]:
        """Shrink [low, high), low fitting and high not, until high - low <= gap, alternating a secant step on
        `value` (the memory a size needs) with bisection."""
        secant = True
        while high - low > gap:
            guess = self._crossing(low, high, value) if secant else None
            size = (low + high) // 2 if guess is None else min(max(guess, low + 1), high - 1)
            if fits(size):
                low = size
            else:
                high = size
            secant = not secant
        return low, high

    def _crossing(self, first: int, second: int, value: Callable[[int], int | None]) -> int | None:
        """The largest size at which the line through `value` at the two sizes stays within the memory, or None
        when a value is unknown or the line does not grow."""
        below, above = value(first), value(second)
        if below is None or above is None or above <= below:
            return None
        return first + int((self.budget - below) * (second - first) / (above - below))

    def floor_fits(self, size: int) -> bool:
        """Whether the activation floor at `size` is within the memory (a size it rules out is recorded)."""
        started = time.perf_counter()
        if self.floor(size) <= self.budget:
            return True
        self._record(Attempt(size, False, self._floor_reason(size), time.perf_counter() - started, solved=False))
        return False

    def try_size(self, size: int) -> bool:
        """Plan one size (unless its activation floor rules it out); record the attempt and return whether it fits."""
        started = time.perf_counter()
        if self.graph_at is not None and self.floor(size) > self.budget:
            self.needs[size] = self.floor(size)
            attempt = Attempt(size, False, self._floor_reason(size), time.perf_counter() - started, solved=False)
            return self._record(attempt)
        try:
            planned = self._plan(size)
        except InfeasibleBudget as error:
            self.errors[size] = error
            if error.minimum is not None:
                self.needs[size] = error.minimum
            reason = f"no plan within the memory: {error}"
            return self._record(Attempt(size, False, reason, time.perf_counter() - started, checked=self.checking))
        plan = planned.plan
        reference = solve(planned.graph, None, method=REFERENCE).cost
        extra = _extra_forward_passes(planned.graph, plan.cost, reference)
        cap = self.max_extra_forward_passes
        fits = cap is None or extra <= cap + 1e-9
        if fits:
            self.fitted[size] = (planned, reference)
            self.needs[size] = plan.peak_memory
        reason = "" if fits else f"{extra:.3g} extra forward passes, above the cap of {cap:g}"
        seconds = time.perf_counter() - started
        return self._record(Attempt(size, fits, reason, seconds, plan.cost, plan.peak_memory, checked=self.checking))

    @property
    def checking(self) -> bool:
        """Whether this is a check (plans with `plan_at`) rather than the search on graphs."""
        return self.plan_at is not None

    def _plan(self, size: int) -> Planned:
        """The method's plan at `size` within the memory; raises InfeasibleBudget."""
        if self.plan_at is not None:
            self._report(f"batch {size}: compiling the real step")
            return self.plan_at(size)
        graph = self.graph(size)
        options = dict(self.solve_options)
        if self.progress is not None and self.takes_progress:
            options["progress"] = lambda snapshot: self._report(f"batch {size}: {snapshot.phase}", snapshot)
        self._report(f"batch {size}: solving")
        return Planned(graph, solve(graph, self.budget, method=self.method, **options))

    def result(self, size: int, *, reached_limit: bool) -> MaxBatch:
        planned, reference = self.fitted[size]
        seconds = time.perf_counter() - self.started
        log.info(
            "%s: largest batch size %s %s is %d (%d sizes tried, %.1f s)",
            self.method,
            "compiled within" if self.checking else "planned on fake tensors within",
            format_bytes(self.budget),
            size,
            len(self.attempts),
            seconds,
        )
        return MaxBatch(
            method=self.method,
            memory=self.budget,
            max_extra_forward_passes=self.max_extra_forward_passes,
            batch_size=size,
            plan=planned.plan,
            graph_size=planned.graph.size,
            compute_ratio=planned.plan.cost / reference if reference > 0 else 1.0,
            extra_forward_passes=_extra_forward_passes(planned.graph, planned.plan.cost, reference),
            attempts=tuple(self.attempts),
            seconds=seconds,
            reached_limit=reached_limit,
        )

    def _floor_reason(self, size: int) -> str:
        return f"the activation floor {format_bytes(self.floor(size))} is above the memory"

    def _record(self, attempt: Attempt) -> bool:
        self.attempts.append(attempt)
        verdict = "fits" if attempt.fits else f"fails: {attempt.reason}"
        log.info("%s at batch %d %s (%.2f s)", self.method, attempt.batch_size, verdict, attempt.seconds)
        return attempt.fits

    def _report(self, phase: str, snapshot: Progress | None = None) -> None:
        if self.progress is None:
            return
        elapsed = time.perf_counter() - self.started
        if snapshot is None:
            snapshot = Progress(elapsed, phase)
        self.progress(dataclasses.replace(snapshot, elapsed=elapsed, phase=f"{self.method} {phase}", time_limit=None))

    def _nothing_fits(self) -> InfeasibleBudget:
        error = self.errors.get(1)
        minimum = None if error is None else error.minimum
        needs = "" if minimum is None else f"; batch size 1 needs {format_bytes(minimum)} ({minimum} bytes)"
        return InfeasibleBudget(
            f"{self.method}: not even batch size 1 fits {format_bytes(self.budget)}: {self.attempts[-1].reason}"
            f"{needs}. Raise the memory, shrink the model, or allow more extra forward passes",
            budget=self.budget,
            minimum=minimum,
        )


def _extra_forward_passes(graph: Graph, cost: float, reference: float) -> float:
    """Cost above `reference`, in units of the forward pass (the summed cost of the forward nodes)."""
    forward = float(graph.costs[~graph.is_backward].sum())
    return (cost - reference) / forward if forward > 0 else 0.0
