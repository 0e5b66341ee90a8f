"""Run independent tasks in parallel: in this process, in local worker processes, or on a Ray cluster.

A `Runner` maps a function over picklable tasks and returns the results in task order, calling `on_result` as
each one finishes (for progress). The function must be importable by name (a module-level function), so a worker
process or a Ray worker can load it; the package must therefore be installed where the workers run.

    rows = LocalRunner(workers=4).map(solve_task, tasks, on_result=lambda row: bar.update())
    rows = RayRunner("auto").map(solve_task, tasks)          # a cluster started with `ray start --head`

What a task computes must not depend on where it runs; the runners only decide where.
"""

from __future__ import annotations

import logging
import multiprocessing
import os
import socket
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ProcessPoolExecutor, as_completed
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

from checkmate.errors import InvalidArgument, RunnerUnavailable

log = logging.getLogger(__name__)

# Seconds to wait for a Ray cluster's address to accept a connection before saying it cannot be reached.
CONNECT_TIMEOUT = 5.0

T = TypeVar("T")
R = TypeVar("R")


class Runner(Protocol):
    """Maps a function over tasks, somewhere."""

    def map(
        self, function: Callable[[T], R], tasks: Sequence[T], on_result: Callable[[R], None] | None = None
    ) -> list[R]:
        """`[function(task) for task in tasks]`, computed in parallel; `on_result` is called (in this process) with
        each result as it arrives, in the order they finish. An exception in a task is raised here."""
        ...


def available_cpus() -> int:
    """CPUs this process may run on (its affinity where the platform tells it, else the machine's count)."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


@dataclass(frozen=True)
class LocalRunner:
    """Worker processes on this machine; with one worker, the tasks run one by one in this process.

    Workers are spawned, not forked: each starts a fresh interpreter (about a second) that imports the task's
    module, so no state of the parent (torch threads, a live solver) is copied into it.

    Attributes:
        workers: processes at once; None for one per available CPU.
    """

    workers: int | None = None

    def __post_init__(self) -> None:
        if self.workers is not None and self.workers < 1:
            raise InvalidArgument(f"workers must be at least 1, got {self.workers}")

    def map(
        self, function: Callable[[T], R], tasks: Sequence[T], on_result: Callable[[R], None] | None = None
    ) -> list[R]:
        workers = min(self.workers or available_cpus(), len(tasks))
        if workers <= 1:
            return [_report(function(task), on_result) for task in tasks]
        log.info("running %d tasks in %d worker processes", len(tasks), workers)
        results: list[Any] = [None] * len(tasks)
        pool = ProcessPoolExecutor(max_workers=workers, mp_context=multiprocessing.get_context("spawn"))
        try:
            futures: dict[Future[R], int] = {pool.submit(function, task): index for index, task in enumerate(tasks)}
            for future in as_completed(futures):
                results[futures[future]] = _report(future.result(), on_result)
        except BaseException:
            pool.shutdown(wait=False, cancel_futures=True)
            raise
        pool.shutdown()
        return results


@dataclass(frozen=True)
class RayRunner:
    """Ray tasks, one CPU each, on the cluster at `address`.

    Attributes:
        address: as `ray.init` reads it: "auto" (the cluster this machine belongs to, started with
            `ray start --head`), "HOST:PORT", "ray://HOST:10001" (Ray Client); "local" or None starts a Ray instance
            for this call only, on this machine.
        num_cpus: CPUs of a local instance (None: all); ignored when joining a cluster.

    If Ray is already initialised in this process, that connection is used and left open; otherwise the runner
    connects (or starts the local instance) for the call and shuts Ray down afterwards.
    """

    address: str | None = None
    num_cpus: int | None = None

    def map(
        self, function: Callable[[T], R], tasks: Sequence[T], on_result: Callable[[R], None] | None = None
    ) -> list[R]:
        ray = _import_ray()
        connect_here = not ray.is_initialized()
        if connect_here:
            self._connect(ray)
        try:
            remote = ray.remote(num_cpus=1)(function)
            pending = {remote.remote(task): index for index, task in enumerate(tasks)}
            log.info("submitted %d tasks to Ray at %s", len(tasks), self.address or "a local instance")
            results: list[Any] = [None] * len(tasks)
            while pending:
                done, _ = ray.wait(list(pending), num_returns=1)
                for reference in done:
                    results[pending.pop(reference)] = _report(ray.get(reference), on_result)
            return results
        finally:
            if connect_here:
                ray.shutdown()

    def _connect(self, ray: Any) -> None:
        if self.address is None or self.address == "local":
            settings: dict[str, Any] = {"address": "local", "num_cpus": self.num_cpus, "include_dashboard": False}
        else:
            settings = {"address": self.address}
        try:
            _check_reachable(self.address)
            ray.init(logging_level=logging.WARNING, **settings)
        except (ConnectionError, RuntimeError, ValueError) as error:
            raise RunnerUnavailable(
                f"cannot reach a Ray cluster at {self.address!r} ({error}); start one with `ray start --head` and "
                "pass the address it prints (or 'auto' on that machine), or pass 'local' for a Ray instance here"
            ) from None


def make_runner(workers: int | None = None, ray_address: str | None = None) -> Runner:
    """The runner the command line asks for: Ray at `ray_address` when one is given, else local processes."""
    if ray_address is not None:
        if workers is not None:
            raise InvalidArgument("--workers sets local processes; with --ray the cluster's CPUs decide, leave it out")
        return RayRunner(ray_address)
    return LocalRunner(workers)


def _report(result: R, on_result: Callable[[R], None] | None) -> R:
    if on_result is not None:
        on_result(result)
    return result


def _check_reachable(address: str | None) -> None:
    """Raise ConnectionError unless something listens at a HOST:PORT (or ray://HOST:PORT) address: given one where
    nothing does, `ray.init` retries for many minutes. Other addresses ("auto", "local") are Ray's to resolve."""
    host, _, port = (address or "").removeprefix("ray://").rpartition(":")
    if not host or not port.isdigit():
        return
    try:
        with socket.create_connection((host, int(port)), timeout=CONNECT_TIMEOUT):
            return
    except OSError as error:
        raise ConnectionError(f"nothing answers at {host}:{port}: {error}") from None


def _import_ray() -> Any:
    try:
        import ray
    except ImportError:
        raise RunnerUnavailable("running on Ray needs ray: pip install 'checkmate-remat[ray]'") from None
    return ray
