"""Status words mean what they say: "optimal" only when a proven bound meets the plan's cost; a plan the search
stopped at within its `mip_gap` is "feasible" and says how far from the bound it may be, in the plan, the log, a
compiled step's report and a plan read back from an older file."""

from __future__ import annotations

import json
import logging

import pytest

import checkmate
from checkmate.examples import random_training_graph
from checkmate.plan import Plan
from checkmate.training.step_report import StepReport


def _stopped_at_a_gap(caplog: pytest.LogCaptureFixture) -> tuple[checkmate.Graph, Plan]:
    graph = random_training_graph(14, seed=1)
    budget = int(0.4 * checkmate.solve(graph, None).peak_memory)
    with caplog.at_level(logging.INFO, logger="checkmate"):
        plan = checkmate.solve(graph, budget, method="optimal", mip_gap=0.5, time_limit=10)
    assert plan.gap is not None and plan.gap > 1e-3, "the search must stop at its mip_gap, short of the optimum"
    return graph, plan


def test_a_plan_stopped_at_a_gap_is_feasible_within_that_gap_in_the_plan_and_the_log(
    caplog: pytest.LogCaptureFixture,
) -> None:
    _, plan = _stopped_at_a_gap(caplog)
    assert plan.status == "feasible"
    assert plan.describe() == f"within {100 * plan.gap:.2g} % of the lower bound"
    messages = [record.getMessage() for record in caplog.records]
    assert not [message for message in messages if "proves" in message or "proven optimal" in message], messages
    assert any("within" in message and "lower bound" in message for message in messages), messages


def test_a_compiled_step_s_report_does_not_call_a_plan_at_a_gap_optimal(caplog: pytest.LogCaptureFixture) -> None:
    _, plan = _stopped_at_a_gap(caplog)
    report = StepReport(
        method=plan.method,
        status=plan.status,
        gap=plan.gap,
        cost_model="flops",
        nodes=28,
        no_remat_peak=100,
        budget=40,
        planned_peak=plan.peak_memory,
        planned_extra_compute=0.1,
        measured_peak=None,
        measured_time=None,
    )
    text = str(report)
    assert "(feasible)" not in text and "proven optimal" not in text
    assert f"within {100 * plan.gap:.2g} % of the lower bound" in text


def test_a_proven_plan_says_so() -> None:
    graph = random_training_graph(10, seed=0)
    budget = int(0.6 * checkmate.solve(graph, None).peak_memory)
    plan = checkmate.solve(graph, budget, method="optimal", mip_gap=0.0, time_limit=30)
    assert plan.status == "optimal" and plan.describe() == "proven optimal"
    assert plan.lower_bound == pytest.approx(plan.cost)


def test_an_older_file_that_called_a_plan_at_a_gap_optimal_reads_as_feasible(caplog: pytest.LogCaptureFixture) -> None:
    graph, plan = _stopped_at_a_gap(caplog)
    stored = json.loads(plan.to_json())
    stored["status"] = "optimal"  # what a file written when "optimal" meant "within mip_gap" says
    again = Plan.from_json(json.dumps(stored), graph)
    assert again.status == "feasible" and again.gap == pytest.approx(plan.gap)
    stored.update(status="optimal", gap=0.0, lower_bound=plan.cost)
    assert Plan.from_json(json.dumps(stored), graph).status == "optimal"
    stored["status"] = "bogus"
    assert Plan.from_json(json.dumps(stored), graph).status == "feasible"
