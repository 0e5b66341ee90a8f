"""A capture's graph with its link to host memory, so that its plan may move values there and back
(`checkmate.moved`); the step runs the moves (`checkmate.execute.host_copies`)."""

from __future__ import annotations

import dataclasses
import logging

import torch

from checkmate.byte_sizes import format_bytes
from checkmate.captured import Captured
from checkmate.errors import InvalidArgument
from checkmate.execute.host_link import measured_link_speeds
from checkmate.options import HostOffload
from checkmate.torch_capture.link_timing import in_cost_unit

log = logging.getLogger(__name__)


def with_host_link(captured: Captured, offload: HostOffload) -> Captured:
    """`captured` with its graph's `host_link`: the offload's link speeds (measured on the capture's device when it
    gives none), priced in the graph's cost unit, and its host budget.

    Raises:
        InvalidArgument: the graph is priced by the "unit" cost model, which has no time to set a copy beside.
    """
    if captured.cost_model == "unit":
        raise InvalidArgument(
            "moves to host memory are priced in time, and the 'unit' cost model has none: use cost_model='profile' or "
            "'flops' with host_budget"
        )
    device = torch.device(captured.device)
    speeds = offload.speeds if offload.speeds is not None else measured_link_speeds(device)
    (cost_per_second,) = in_cost_unit((1.0,), captured.cost_model, device)
    link = speeds.priced(cost_per_second, offload.budget)
    log.info(
        "moves to host memory allowed: %.3g GB/s out, %.3g GB/s back, overlap %.2f, host budget %s",
        speeds.to_host / 1e9,
        speeds.to_device / 1e9,
        speeds.overlap,
        "unlimited" if offload.budget is None else format_bytes(offload.budget),
    )
    return dataclasses.replace(captured, graph=dataclasses.replace(captured.graph, host_link=link))
