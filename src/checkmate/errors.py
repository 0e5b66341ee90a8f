"""Typed errors. Each message says what went wrong and what to do about it."""

from __future__ import annotations


class CheckmateError(Exception):
    """Base class of every error this package raises on purpose."""


class InvalidArgument(CheckmateError, ValueError):
    """An argument the caller can fix: a budget or size that does not parse, an unknown method, an option the method
    does not take, a command-line value out of range."""


class InvalidGraph(CheckmateError, ValueError):
    """The graph is malformed: a cycle, a forward reference, a negative size, bad JSON."""


class InvalidSchedule(CheckmateError, ValueError):
    """A plan (R, S) breaks one of the paper's constraints; the message names the first one."""


class InfeasibleBudget(CheckmateError, ValueError):
    """No plan of the requested method fits the budget.

    Attributes:
        budget: the budget asked for, in bytes.
        minimum: the smallest budget the method could meet, in bytes, or None when unknown.
    """

    def __init__(self, message: str, *, budget: int, minimum: int | None) -> None:
        super().__init__(message)
        self.budget = budget
        self.minimum = minimum


class MethodNotApplicable(CheckmateError, ValueError):
    """The method does not handle this graph's shape (griewank needs a chain); the message names what to use."""


class SolverUnavailable(CheckmateError, RuntimeError):
    """A solver backend was asked for but its package is not installed or not licensed."""


class CaptureError(CheckmateError, RuntimeError):
    """The model cannot be captured into a training graph; the message names the construct."""


class ExecutionError(CheckmateError, RuntimeError):
    """Running a schedule failed or would be wrong (for example a batch of an unplanned shape)."""


class DataParallelError(CheckmateError, ValueError):
    """A DistributedDataParallel module uses a setting that a compiled step does not reproduce; the message says
    which, and what to change."""


class ShardedTrainingError(CheckmateError, ValueError):
    """A model sharded with FSDP2's `fully_shard` uses a feature that a compiled step does not reproduce (CPU offload,
    mixed precision, a 2-D mesh, tensor-parallel parameters, a root that is not sharded, another batch shape on each
    rank); the message names it, and what to change."""


class RankFailed(CheckmateError, RuntimeError):
    """Another rank of the process group failed where every rank must succeed together (compiling a distributed
    step); the message names the ranks, and the error itself is raised on them."""


class RunnerUnavailable(CheckmateError, RuntimeError):
    """Parallel work cannot start: Ray is not installed, or the cluster at the address given cannot be reached."""


# What a method may answer instead of a plan, and a comparison reports as a row: no plan within the budget, a graph of
# a shape it does not handle, a solver that is not installed. Anything else (an invalid schedule above all) is a bug
# and propagates.
EXPECTED_FAILURES: tuple[type[CheckmateError], ...] = (InfeasibleBudget, MethodNotApplicable, SolverUnavailable)
