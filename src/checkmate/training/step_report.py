"""What a compiled step reports: the plan's figures beside the measured ones."""

from __future__ import annotations

import logging
from dataclasses import dataclass

from checkmate.byte_sizes import format_bytes
from checkmate.graph import Graph
from checkmate.moved import transfers
from checkmate.options import CostModel
from checkmate.plan import Plan, PlanStatus, describe_status
from checkmate.simulate import stage_compute
from checkmate.stage_times import StageTimes

log = logging.getLogger(__name__)

LABEL_WIDTH = 17


@dataclass(frozen=True)
class MovesReport:
    """A plan's moves to host memory as a step reports them (`checkmate.moved.Transfers`).

    Attributes:
        host_peak: the most bytes the moved values hold in host memory.
        host_budget: the host memory allowed (None: no limit).
        bytes_to_host: bytes copied to host memory in a step.
        bytes_to_device: bytes copied back.
        transfer_time: the copies' time on the link, both directions, in the plan's cost unit (seconds under
            "profile" costs).
        hidden: the fraction of it the plan prices as hidden beside compute.
    """

    host_peak: int
    host_budget: int | None
    bytes_to_host: int
    bytes_to_device: int
    transfer_time: float
    hidden: float

    def __str__(self) -> str:
        budget = "no limit" if self.host_budget is None else f"of {format_bytes(self.host_budget)}"
        return (
            f"host memory {format_bytes(self.host_peak)} ({budget}); {format_bytes(self.bytes_to_host)} out, "
            f"{format_bytes(self.bytes_to_device)} back, {self.transfer_time:.4g} on the link, {self.hidden:.0%} "
            "hidden beside compute"
        )


@dataclass(frozen=True)
class StepReport:
    """Planned and measured figures of a compiled step, for one batch shape.

    Attributes:
        method: the strategy that made the plan.
        status: "optimal" when a proven lower bound meets the plan's cost, else "feasible".
        gap: the plan's relative gap to its lower bound, or None when no bound is known.
        cost_model: how ops were priced ("profile", "flops" or "unit"); the plan's extra compute is in these units.
        nodes: planning nodes in the graph.
        no_remat_peak: bytes at the peak with no recomputation (the checkpoint_all plan).
        budget: the budget in bytes, fixed at compile for every batch shape (a fraction is of the compile batch's
            peak without recomputation).
        planned_peak: the plan's simulated peak in bytes.
        planned_extra_compute: extra compute of the plan over no recomputation, as a fraction (0.1 = 10 %).
        measured_peak: live tensor bytes at the peak of the first measured call, or None before one.
        measured_time: seconds of the last call that was timed (calls measuring CPU memory are not), or None.
        planned_time: the plan's compute in seconds as the search priced it (`Plan.cost`), when costs are measured
            time ("profile" costs), else None.
        predicted_time: the step's compute in seconds as it runs, when costs are measured time, else None: the plan's
            steps after the executor's passes, fused calls at their measured time
            (`checkmate.execute.predicted_time`). Beside `measured_time`: how far the time model is from the step.
        reused_from: the batch shapes whose plan this shape runs, as the log writes them (`CompiledStep.improve`
            plans this shape for itself), or None when the plan was made for this shape.
        planning_times: where the time of planning this shape went (capture, node compilation and measuring,
            solving, fused runs: `checkmate.stage_times`), or None for a plan reused from another shape.
        moves: the plan's moves to host memory, or None when it moves nothing.
    """

    method: str
    status: PlanStatus
    gap: float | None
    cost_model: CostModel
    nodes: int
    no_remat_peak: int
    budget: int
    planned_peak: int
    planned_extra_compute: float
    measured_peak: int | None
    measured_time: float | None
    reused_from: str | None = None
    planned_time: float | None = None
    predicted_time: float | None = None
    planning_times: StageTimes | None = None
    moves: MovesReport | None = None

    def __str__(self) -> str:
        measured_peak = "not yet measured" if self.measured_peak is None else format_bytes(self.measured_peak)
        measured_time = "not yet timed" if self.measured_time is None else f"{self.measured_time * 1e3:.1f} ms"
        if self.predicted_time is not None:
            predicted = f"predicted {self.predicted_time * 1e3:.1f} ms"
            planned = self.planned_time
            if planned is not None and abs(planned - self.predicted_time) > 0.005 * planned:
                predicted += f" ({planned * 1e3:.1f} ms as planned, before fusing runs)"
            measured_time = f"{predicted}, measured {measured_time}"
            if self.measured_time is not None and self.predicted_time > 0:
                measured_time += f" ({self.measured_time / self.predicted_time:.2f}x the prediction)"
        plan = f"method {self.method}, {self.nodes} nodes, {self.cost_model} costs"
        if self.reused_from is not None:
            plan += f"; the plan of batch {self.reused_from} (step.improve(*batch) plans this shape)"
        budget = f"{format_bytes(self.budget)} ({self.budget / max(self.no_remat_peak, 1):.0%} of no-remat)"
        rows = [
            ("plan", plan),
            ("plan quality", describe_status(self.status, self.gap)),
            ("no-remat peak", format_bytes(self.no_remat_peak)),
            ("budget", f"{budget}, fixed at compile"),
            ("planned peak", format_bytes(self.planned_peak)),
            ("measured peak", measured_peak),
            ("planned extra compute", f"{self.planned_extra_compute:+.1%}"),
            ("step time", measured_time),
        ]
        if self.moves is not None:
            rows.append(("moves", str(self.moves)))
        if self.planning_times is not None:
            rows.append(("planning time", str(self.planning_times)))
        return "\n".join(f"{label:<{LABEL_WIDTH}}  {value}" for label, value in rows)


def moves_report(graph: Graph, plan: Plan) -> MovesReport | None:
    """What `plan`'s moves carry and cost on `graph`, or None when it moves nothing."""
    link = graph.host_link
    if link is None or not plan.moves.any:
        return None
    moved = transfers(graph.memory, link, plan.moves, plan.S, stage_compute(graph, plan.R))
    return MovesReport(
        plan.host_peak,
        link.host_memory,
        moved.bytes_to_host,
        moved.bytes_to_device,
        moved.transfer_time,
        moved.hidden,
    )
