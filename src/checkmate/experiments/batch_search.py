"""The largest batch size that trains within a memory limit (the paper's Figure 6), by solving at candidate sizes.

    result = checkmate.max_batch(checkmate.zoo.mobilenet, "16GiB", method="optimal", max_overhead=1.0)
    result.batch_size, result.plan.cost, result.attempts

The paper maximises a batch-size variable inside one MILP with quadratic constraints (its section 6.4), which needs a
day of Gurobi. Here the batch size is searched from outside: the step is captured on fake tensors at a candidate
size (no activation is allocated) and `checkmate.solve` plans it within the memory. The search grows the size until
a plan fails, then narrows the bracket between the largest size that fit and the smallest that did not, guided by
the memory each size needed (memory grows about linearly with the batch), with bisection as the fallback
(`search_max_batch` has the steps). A size whose activation floor (`checkmate.bounds.activation_floor`: the fixed
memory plus the largest node with its inputs) is above the memory fails without a solve. The search assumes that a
size fits whenever a larger one does.

`max_overhead` is the paper's cost constraint (its eq. 10): a plan fits only if its cost exceeds the cost without
rematerialization (`checkpoint_all`) at that batch size by at most `max_overhead` forward passes (the summed cost of
the forward nodes); 1.0 is the paper's "at most one extra forward pass". It is counted in forward passes, not as a
ratio, so that it means the same under every cost model.

The search itself (`search_max_batch`) takes any `graph_at(batch_size) -> Graph` and imports no torch; `max_batch`
builds that function from a model factory with `checkmate.torch_capture.fake_factory` (torch).
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from checkmate.bounds import activation_floor
from checkmate.errors import InfeasibleBudget, InvalidArgument
from checkmate.graph import Graph
from checkmate.plan import Plan
from checkmate.progress import Progress, ProgressCallback
from checkmate.solve import solve
from checkmate.strategies.registry import get_strategy, option_names
from checkmate.units import format_bytes, parse_bytes

log = logging.getLogger(__name__)

REFERENCE = "checkpoint_all"
# The largest batch size tried unless the caller gives another `limit`: a graph whose memory does not grow with the
# batch size (a factory that ignores it) would otherwise double forever.
DEFAULT_LIMIT = 1 << 20

GraphAt = Callable[[int], Graph]


@dataclass(frozen=True)
class Attempt:
    """One batch size tried.

    Attributes:
        batch_size: the size.
        fits: whether the method found a plan within the memory (and the overhead cap).
        reason: why it failed ("" when it fit): the activation floor, the method's error, or the overhead.
        seconds: wall-clock seconds for this size, capture and solve included.
        cost: the plan's cost when the method found one within the memory, else None.
        peak_memory: that plan's peak in bytes, else None.
        solved: whether the method ran (False when the activation floor ruled the size out).
    """

    batch_size: int
    fits: bool
    reason: str
    seconds: float
    cost: float | None = None
    peak_memory: int | None = None
    solved: bool = True


@dataclass(frozen=True)
class MaxBatch:
    """The largest batch size a method plans within a memory limit, and its plan.

    Attributes:
        method: the method searched with.
        memory: the memory limit in bytes, fixed memory included.
        max_overhead: the cap on extra compute in forward passes, or None.
        batch_size: the largest size found to fit: the next size up failed (within `tolerance` of it: a size
            that failed), or it is `limit`.
        plan: the method's plan at that size.
        graph_size: nodes of the graph at that size.
        overhead: the plan's cost divided by the cost without rematerialization at that size.
        extra_forward_passes: the plan's extra cost over that, in forward passes (what `max_overhead` caps).
        attempts: every size tried, in order.
        seconds: wall-clock seconds of the whole search.
        reached_limit: True when `batch_size` is the search's `limit`: the memory does not bound the batch below it.
    """

    method: str
    memory: int
    max_overhead: float | None
    batch_size: int
    plan: Plan
    graph_size: int
    overhead: float
    extra_forward_passes: float
    attempts: tuple[Attempt, ...]
    seconds: float
    reached_limit: bool = False


def max_batch(
    factory: Callable[..., Any],
    memory: int | str,
    *,
    method: str = "optimal",
    max_overhead: float | None = None,
    cost_model: str = "flops",
    factory_options: dict[str, Any] | None = None,
    start: int = 1,
    limit: int = DEFAULT_LIMIT,
    tolerance: float = 0.0,
    progress: ProgressCallback | None = None,
    **solve_options: Any,
) -> MaxBatch:
    """The largest `batch_size` for which `method` plans the step of `factory` within `memory` bytes (imports torch).

    Args:
        factory: called as `factory(batch_size=n, **factory_options)`, returns `(model, loss_fn, batch)` like the
            factories of `checkmate.zoo`; it is called under a FakeTensorMode, so nothing is allocated.
        memory: bytes, or a size such as "16GiB", fixed memory (parameters, gradients, inputs) included.
        method: a name from `checkmate methods`.
        max_overhead: at most this many extra forward passes of compute over the step without rematerialization at
            the same batch size (1.0: the paper's cap for Figure 6); None for no cap.
        cost_model: "flops" (the paper's for Figure 6) or "unit"; "profile" needs real tensors and is refused.
        factory_options: more keyword arguments for the factory (a width multiplier, a resolution).
        start: the first size tried, for example the answer of a method this one is known to beat.
        limit: the largest size tried.
        tolerance: stop bisecting once the bracket is within this fraction of the size that fits (0: exact).
        progress: called with `checkmate.progress.Progress` snapshots (the size being tried, the solver's phase).
        **solve_options: options of the method, for each solve (for example `time_limit`, seconds per solve).

    Raises:
        InfeasibleBudget: not even batch size 1 fits; raise `memory`.
        CaptureError: the factory's step cannot be captured.
    """
    from checkmate.torch_capture.fake_factory import fake_graph_at

    graph_at = fake_graph_at(factory, cost_model=cost_model, **(factory_options or {}))
    return search_max_batch(
        graph_at,
        memory,
        method=method,
        max_overhead=max_overhead,
        start=start,
        limit=limit,
        tolerance=tolerance,
        progress=progress,
        **solve_options,
    )


def search_max_batch(
    graph_at: GraphAt,
    memory: int | str,
    *,
    method: str = "optimal",
    max_overhead: float | None = None,
    start: int = 1,
    limit: int = DEFAULT_LIMIT,
    tolerance: float = 0.0,
    progress: ProgressCallback | None = None,
    **solve_options: Any,
) -> MaxBatch:
    """The largest batch size n for which `method` plans `graph_at(n)` within `memory` bytes (no torch).

    1. Try `start`; halve until a size fits, or grow until one fails: to the first size where the line through the
       memory the last two sizes needed predicts a failure, or double when that line predicts no growth.
    2. When that size failed on its activation floor, find the largest size whose floor fits (graphs only, no
       solve) and solve there once: when the method fits at its floor's limit, that is the answer (it often is for
       `optimal`).
    3. Narrow the bracket, alternating a secant step (on the memory each end needed: the plan's peak, or the
       smallest budget the method said it could meet) with bisection, so sizes whose memory grows linearly take a
       step or two and no search takes more than about twice log2 of the bracket.

    The arguments are those of `max_batch`; `graph_at` is called once per size.

    Raises:
        InfeasibleBudget: not even batch size 1 fits.
        ValueError: a bad argument (unknown method, start outside [1, limit], negative overhead or tolerance).
    """
    budget = parse_bytes(memory)
    get_strategy(method)
    if not 1 <= start <= limit:
        raise InvalidArgument(f"start must lie in [1, limit={limit}], got {start}")
    if max_overhead is not None and max_overhead < 0:
        raise InvalidArgument(f"max_overhead is extra forward passes and must be >= 0, got {max_overhead}")
    if tolerance < 0:
        raise InvalidArgument(f"tolerance is a fraction of the batch size and must be >= 0, got {tolerance}")
    search = _Search(graph_at, budget, method, max_overhead, progress, solve_options)
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


class _Search:
    """The state of one search: graphs and plans by size, the sizes tried, the clock (internal)."""

    def __init__(
        self,
        graph_at: GraphAt,
        budget: int,
        method: str,
        max_overhead: float | None,
        progress: ProgressCallback | None,
        solve_options: dict[str, Any],
    ) -> None:
        self.graph_at = graph_at
        self.budget = budget
        self.method = method
        self.max_overhead = max_overhead
        self.progress = progress
        self.solve_options = solve_options
        names = option_names(method)
        self.takes_progress = names is None or "progress" in names
        self.started = time.perf_counter()
        self.attempts: list[Attempt] = []
        self.graphs: dict[int, Graph] = {}
        self.fitted: dict[int, tuple[Plan, float]] = {}  # size -> (plan, cost without rematerialization)
        self.errors: dict[int, InfeasibleBudget] = {}
        self.needs: dict[int, int] = {}  # size -> the memory it needed: a plan's peak, or a budget it said it needs

    def graph(self, size: int) -> Graph:
        if size not in self.graphs:
            self._report(f"batch {size}: capturing")
            self.graphs[size] = self.graph_at(size)
        return self.graphs[size]

    def floor(self, size: int) -> int:
        """The activation floor of the graph at `size`: no plan of it peaks lower."""
        return activation_floor(self.graph(size))

    def bracket(self, start: int, limit: int) -> tuple[int, int]:
        """(a size that fits, a larger size that fails or limit + 1): halve from `start` until a size fits, or
        grow from it until one fails."""
        size, fails = start, limit + 1
        while not self.try_size(size):
            if size == 1:
                raise self._nothing_fits()
            fails, size = size, size // 2
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
        graph = self.graph(size)
        if self.floor(size) > self.budget:
            self.needs[size] = self.floor(size)
            attempt = Attempt(size, False, self._floor_reason(size), time.perf_counter() - started, solved=False)
            return self._record(attempt)
        options = dict(self.solve_options)
        if self.progress is not None and self.takes_progress:
            options["progress"] = lambda snapshot: self._report(f"batch {size}: {snapshot.phase}", snapshot)
        self._report(f"batch {size}: solving")
        try:
            plan = solve(graph, self.budget, method=self.method, **options)
        except InfeasibleBudget as error:
            self.errors[size] = error
            if error.minimum is not None:
                self.needs[size] = error.minimum
            reason = f"no plan within the memory: {error}"
            return self._record(Attempt(size, False, reason, time.perf_counter() - started))
        reference = solve(graph, None, method=REFERENCE).cost
        extra = _extra_forward_passes(graph, plan.cost, reference)
        fits = self.max_overhead is None or extra <= self.max_overhead + 1e-9
        if fits:
            self.fitted[size] = (plan, reference)
            self.needs[size] = plan.peak_memory
        reason = "" if fits else f"{extra:.3g} extra forward passes, above the cap of {self.max_overhead:g}"
        attempt = Attempt(size, fits, reason, time.perf_counter() - started, plan.cost, plan.peak_memory)
        return self._record(attempt)

    def result(self, size: int, *, reached_limit: bool) -> MaxBatch:
        plan, reference = self.fitted[size]
        graph = self.graphs[size]
        seconds = time.perf_counter() - self.started
        log.info(
            "%s: largest batch size within %s is %d (%d sizes tried, %.1f s)",
            self.method,
            format_bytes(self.budget),
            size,
            len(self.attempts),
            seconds,
        )
        return MaxBatch(
            method=self.method,
            memory=self.budget,
            max_overhead=self.max_overhead,
            batch_size=size,
            plan=plan,
            graph_size=graph.size,
            overhead=plan.cost / reference if reference > 0 else 1.0,
            extra_forward_passes=_extra_forward_passes(graph, plan.cost, reference),
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
            f"{needs}. Raise the memory, shrink the model, or allow more overhead",
            budget=self.budget,
            minimum=minimum,
        )


def _extra_forward_passes(graph: Graph, cost: float, reference: float) -> float:
    """Cost above `reference`, in units of the forward pass (the summed cost of the forward nodes)."""
    forward = float(graph.costs[~graph.is_backward].sum())
    return (cost - reference) / forward if forward > 0 else 0.0
