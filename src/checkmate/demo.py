"""`python -m checkmate.demo` (what `make demo` runs): train a small GPT within half its no-recomputation peak.

It compiles a two-block GPT (attention, dropout, LayerNorm, tied embeddings) with the `optimal` method
at 50 % of the peak memory of a step without recomputation, trains it for a few SGD steps next to an
eager copy of the same model under the same seeds, checks that losses and gradients are bit-for-bit the
same (dropout masks are replayed when recomputed), and prints the planned figures beside the measured
ones: the peak, and the time against the same model compiled without recomputation (op costs are
profiled on this machine, so the planned extra compute is in seconds too). A progress line shows what is
running while it captures and solves.
"""

from __future__ import annotations

import argparse
import copy
import logging
import statistics
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import torch
from torch import nn

import checkmate
import checkmate.training.compiled
from checkmate import zoo
from checkmate.byte_sizes import format_bytes
from checkmate.execute import eager_peak
from checkmate.options import CostModel, choices
from checkmate.search_defaults import TIMED_METHODS
from checkmate.strategies.registry import strategies
from checkmate.training.step_report import LABEL_WIDTH

log = logging.getLogger(__name__)

TIMING_REPEATS = 15


class _Ticker(logging.Handler):
    """One status line on stderr: the latest checkmate log message and the seconds elapsed, redrawn twice a second."""

    def __init__(self, label: str) -> None:
        super().__init__(logging.INFO)
        self.label = label
        self.started = time.perf_counter()
        self.stopped = threading.Event()

    def emit(self, record: logging.LogRecord) -> None:
        self.label = record.getMessage()[:90]
        if not sys.stderr.isatty():
            self.draw()

    def run(self) -> None:
        while not self.stopped.wait(0.5):
            if sys.stderr.isatty():
                self.draw()

    def draw(self) -> None:
        start, end = ("\r\033[K", "") if sys.stderr.isatty() else ("", "\n")
        sys.stderr.write(f"{start}[{time.perf_counter() - self.started:6.1f} s] {self.label}{end}")
        sys.stderr.flush()


@contextmanager
def progress(label: str) -> Iterator[None]:
    """Show a live status line while the block runs, fed by checkmate's INFO log messages."""
    ticker = _Ticker(label)
    package_log = logging.getLogger("checkmate")
    previous_level = package_log.level
    package_log.setLevel(logging.INFO)
    package_log.addHandler(ticker)
    thread = threading.Thread(target=ticker.run, daemon=True)
    thread.start()
    try:
        yield
    finally:
        ticker.stopped.set()
        thread.join()
        package_log.removeHandler(ticker)
        package_log.setLevel(previous_level)
        ticker.label = f"{label}: done"
        ticker.draw()
        if sys.stderr.isatty():
            sys.stderr.write("\n")


def _median_times(runners: dict[str, Callable[[], float]], repeats: int) -> dict[str, float]:
    """Median of the seconds each runner reports, the runners interleaved so drift on a shared machine hits all."""
    times: dict[str, list[float]] = {name: [] for name in runners}
    for _ in range(repeats):
        for name, run in runners.items():
            times[name].append(run())
    return {name: statistics.median(values) for name, values in times.items()}


def _timed(function: Callable[[], Any]) -> float:
    started = time.perf_counter()
    function()
    return time.perf_counter() - started


def _eager_step(model: nn.Module, loss_fn: Callable[..., torch.Tensor], batch: Sequence[Any]) -> torch.Tensor:
    loss = loss_fn(model, *batch)
    loss.backward()
    return loss.detach()


def _largest_difference(model: nn.Module, reference: nn.Module) -> tuple[float, list[str]]:
    """The largest difference of any `.grad` or buffer from the reference's, and the parameters whose `.grad` is set
    on one side only (a difference no number shows)."""
    pairs = list(zip(model.named_parameters(), reference.named_parameters(), strict=True))
    one_sided = [name for (name, got), (_, want) in pairs if (got.grad is None) != (want.grad is None)]
    differences = [
        (got.grad - want.grad).abs().max().item()
        for (_, got), (_, want) in pairs
        if want.grad is not None and got.grad is not None
    ]
    differences += [
        (got.float() - want.float()).abs().max().item()
        for got, want in zip(model.buffers(), reference.buffers(), strict=True)
    ]
    return max(differences, default=0.0), one_sided


def _verdict(difference: float, one_sided: list[str]) -> str:
    if one_sided:
        return f"DIFFER from eager: .grad set on one side only for {', '.join(one_sided)}"
    return "bit-identical to eager" if difference == 0.0 else f"max difference from eager {difference:.3g}"


def _train(
    step: checkmate.training.compiled.CompiledStep, reference: nn.Module, batch: Sequence[Any], steps: int
) -> None:
    optimizers = [torch.optim.SGD(m.parameters(), lr=0.05, momentum=0.9) for m in (step.model, reference)]
    for number in range(1, steps + 1):
        torch.manual_seed(number)
        loss = step(*batch)
        torch.manual_seed(number)
        expected = _eager_step(reference, step.loss_fn, batch)
        difference, one_sided = _largest_difference(step.model, reference)
        verdict = _verdict(max(difference, (loss - expected).abs().item()), one_sided)
        print(f"  step {number}: loss {loss.item():.5f} (eager {expected.item():.5f}); gradients and buffers {verdict}")
        for optimizer in optimizers:
            optimizer.step()
            optimizer.zero_grad()


def _method(requested: str) -> str:
    available = {strategy.name for strategy in strategies()}
    if requested in available:
        return requested
    fallback = "chen_greedy" if "chen_greedy" in available else "checkpoint_all"
    print(f"method {requested!r} is not available here; falling back to {fallback!r}")
    return fallback


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--budget", type=float, default=0.5, help="fraction of the no-recomputation peak")
    parser.add_argument("--method", default="optimal")
    parser.add_argument("--time-limit", type=float, default=60.0, help="seconds for the solver")
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--cost-model", default="profile", choices=choices(CostModel))
    arguments = parser.parse_args(argv)
    torch.set_num_threads(1)
    model, loss_fn, batch = zoo.gpt(batch_size=16, length=32, dim=32, heads=2, layers=2, vocab=64)
    model.train()
    reference = copy.deepcopy(model)
    method = _method(arguments.method)
    options = {"time_limit": arguments.time_limit} if method in TIMED_METHODS else {}
    print(f"GPT, 2 blocks, {sum(p.numel() for p in model.parameters())} parameters, tokens {tuple(batch[0].shape)}")
    with progress("capturing and solving"):
        step = checkmate.compile(
            model, loss_fn, batch, budget=arguments.budget, method=method, cost_model=arguments.cost_model, **options
        )
    print(f"training {arguments.steps} steps next to an eager copy:")
    _train(step, reference, batch, arguments.steps)
    _summary(step, reference, batch)


def _summary(step: checkmate.training.compiled.CompiledStep, reference: nn.Module, batch: Sequence[Any]) -> None:
    report = step.report()
    reference.zero_grad(set_to_none=True)
    eager_bytes = eager_peak(reference, step.loss_fn, batch)
    no_remat = checkmate.compile(
        step.model,
        step.loss_fn,
        batch,
        budget=1.0,
        method="checkpoint_all",
        cost_model=report.cost_model,
        measure_memory="never",
    )
    times = _median_times(
        {
            "plan": lambda: _timed(lambda: step(*batch)),
            "no-remat": lambda: _timed(lambda: no_remat(*batch)),
            "eager": lambda: _timed(lambda: _eager_step(reference, step.loss_fn, batch)),
        },
        repeats=TIMING_REPEATS,
    )
    measured = report.measured_peak
    print()
    print(report)
    print(f"{'eager peak':<{LABEL_WIDTH}}  {format_bytes(eager_bytes)} (measured the same way)")
    if measured is not None:
        print(f"{'measured / eager':<{LABEL_WIDTH}}  {measured / eager_bytes:.0%} of eager's peak")
    milliseconds = {name: f"{value * 1e3:.2f} ms" for name, value in times.items()}
    print(
        f"{'measured extra time':<{LABEL_WIDTH}}  {times['plan'] / times['no-remat'] - 1:+.1%} against the compiled "
        f"step without recomputation ({milliseconds['plan']} vs {milliseconds['no-remat']}, median of {TIMING_REPEATS})"
    )
    print(
        f"{'against eager':<{LABEL_WIDTH}}  {times['plan'] / times['eager'] - 1:+.1%} time "
        f"(eager {milliseconds['eager']}; without recomputation {times['no-remat'] / times['eager'] - 1:+.1%})"
    )


if __name__ == "__main__":
    main()
