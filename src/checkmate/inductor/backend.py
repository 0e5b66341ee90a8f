"""`checkmate.backend`: a `torch.compile` backend that plans each compiled region within a memory budget.

    model = torch.compile(model, backend=checkmate.backend(budget="8GiB"))
    loss = loss_fn(model(x), y); loss.backward(); optimizer.step()      # the user's own loop

For each region Dynamo captures, AOTAutograd traces the joint forward + backward graph and calls this backend's
partition function, which plans it as `checkmate.compile(..., executor="inductor")` plans a step: capture groups the
joint graph's ops as Inductor fuses them (`checkmate.torch_capture.joint`), every node is compiled by Inductor and
measured on the example inputs (`kernels`, `measure`, `pricing`), the method solves for the budget through the path
`checkmate.compile` plans through (`checkmate.solving`: the disk plan cache, `planning_time_limit`, progress
lines, Ctrl-C), and the schedule is cut into the forward and backward graphs AOTAutograd runs (`split`):
recomputations stay separate calls, values live no longer than the plan says.

What the budget covers: one region's forward and backward, on the terms of `checkmate.compile`: its inputs
(parameters, buffers, the user's tensors), the outputs the forward returns and the gradients of the outputs (the
tangents), the gradients it makes (each from the node that makes it), and every activation in between. It does not
cover what the user's code holds outside the region (the loss computed after the model, say), nor `.grad`s from
earlier steps (AOTAutograd accumulates into them after the region's backward). A graph break makes several regions:
each is planned alone with the whole budget (a fraction is of that region's own no-recomputation peak), logged, and
listed in `backend.regions`, so no part runs unplanned without saying so; together they may hold more than one budget.
A budget in bytes is a limit: a region that cannot fit raises `InfeasibleBudget`. A fraction asks each region for that
share of its own peak, as `torch.compile`'s `activation_memory_budget` does: a region that cannot go that low (a small
region, or one whose inputs and outputs are most of its peak) is planned at the smallest budget known to fit, with
a warning, so one such region does not stop the training.
With `host_budget` (or `host_link`), a region's plan may also move values to host memory and back, as
`checkmate.compile`'s does: the copies are calls of the region's graphs (`checkmate.inductor.moved_region`), and a
value moved from the forward to the backward is saved as a ticket, not held on the device.
Regions without gradients (inference) are compiled by Inductor as usual, without a plan. Shapes are static: a new
input shape makes Dynamo compile (and plan) the region again, as `checkmate.compile` replans a new batch shape.
"""

from __future__ import annotations

import dataclasses
import logging
import operator
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch._guards
from torch._functorch.aot_autograd import aot_module_simplified
from torch._inductor.compile_fx import compile_fx
from torch._subclasses.fake_tensor import unset_fake_temporarily
from torch.fx.graph import _BoxedCodeGen
from torch.utils import _pytree as pytree

from checkmate import disk_cache, solving
from checkmate.byte_sizes import format_bytes, parse_budget, resolve_budget
from checkmate.captured import Captured
from checkmate.errors import InfeasibleBudget
from checkmate.execute.linked_graph import with_host_link
from checkmate.inductor.choice import faster_kernels
from checkmate.inductor.kernels import compile_kernels, example_value, leaving_values
from checkmate.inductor.memory_traffic import memory_traffic
from checkmate.inductor.moved_region import RegionCopier, region_steps
from checkmate.inductor.pricing import priced_graph
from checkmate.inductor.split import split_schedule
from checkmate.moved import LinkSpeeds
from checkmate.options import BackendCostModel, HostOffload, check_choice, host_offload
from checkmate.plan import Plan, schedule_of
from checkmate.search_defaults import with_search_defaults
from checkmate.solve import check_solve_options, solve
from checkmate.torch_capture import random_state_bytes
from checkmate.torch_capture.joint import capture_joint

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class PlannedRegion:
    """One compiled region and its plan.

    Attributes:
        index: the order in which Dynamo compiled it (0 first).
        nodes: planning nodes of its joint graph.
        budget: the budget it was planned within, in bytes (for a fraction below what the region can reach, the
            smallest budget known to fit).
        no_remat_peak: its peak without recomputation.
        plan: the plan it runs (`plan.peak_memory` is its predicted peak, `plan.cost` its compute, `plan.host_peak`
            the bytes its moves hold in host memory).
        no_remat_cost: the compute of its plan without recomputation.
        copier: what runs its copies to host memory and back (`RegionCopier.pooled_bytes`: the host copies kept).
    """

    index: int
    nodes: int
    budget: int
    no_remat_peak: int
    plan: Plan
    no_remat_cost: float
    copier: RegionCopier = dataclasses.field(default_factory=RegionCopier, compare=False, repr=False)


@dataclass(frozen=True)
class BackendSettings:
    """How `checkmate.backend` plans each region: the budget, the method and its options (with the search
    defaults), the cost model, the seconds for all of one region's planning, whether the disk caches are used, and
    the moves to host memory allowed (None: none)."""

    budget: int | float | str
    method: str
    cost_model: BackendCostModel
    solve_options: dict[str, Any]
    planning_time_limit: float | None = None
    cache: bool = True
    offload: HostOffload | None = None


class CheckmateBackend:
    """A `torch.compile` backend; `regions` lists the regions it has planned, in order."""

    def __init__(self, settings: BackendSettings) -> None:
        self.settings = settings
        self.regions: list[PlannedRegion] = []

    @property
    def solve_options(self) -> dict[str, Any]:
        """The method's options each region is solved with (the search defaults included)."""
        return self.settings.solve_options

    def __call__(self, module: torch.fx.GraphModule, example_inputs: Sequence[Any]) -> Callable[..., Any]:
        examples = list(example_inputs)
        output = next(node for node in module.graph.nodes if node.op == "output")
        user_outputs = len(pytree.tree_leaves(output.args[0]))

        def partition(joint: torch.fx.GraphModule, joint_inputs: Any, *, num_fwd_outputs: int, **_: Any) -> Any:
            started = time.perf_counter()
            settings = self.settings
            with solving.planning_scope(settings.solve_options), disk_cache.caching(settings.cache):
                return self._plan_region(
                    joint, joint_inputs, num_fwd_outputs, examples, num_fwd_outputs - user_outputs, started
                )

        return aot_module_simplified(
            module,
            examples,
            fw_compiler=_run_as_built,
            bw_compiler=_run_as_built,
            inference_compiler=_inductor,
            partition_fn=partition,
        )

    def _plan_region(
        self,
        joint: torch.fx.GraphModule,
        joint_inputs: Any,
        forward_count: int,
        examples: list[Any],
        mutation_count: int,
        started: float,
    ) -> tuple[torch.fx.GraphModule, torch.fx.GraphModule]:
        """Plan one region's joint graph and cut it into its forward and backward graphs; `started` is when its
        planning began (`planning_time_limit` counts from it)."""
        settings = self.settings
        fake_mode = torch._guards.detect_fake_mode(joint_inputs)
        output = next(node for node in joint.graph.nodes if node.op == "output")
        values = list(output.args[0])
        forward = [node.name for node in values[:forward_count]]
        gradients = [None if node is None else node.name for node in values[forward_count:]]
        device = _device(examples)
        mutated = _mutated_inputs(joint, mutation_count, gradients)
        captured = capture_joint(
            joint, forward, gradients, device=device, random_state_bytes=random_state_bytes(device)
        )
        index = len(self.regions)
        log.info("region %d: %d planning nodes; compiling and measuring them", index, captured.graph.size)
        with unset_fake_temporarily(), torch._guards.tracing(None), torch.no_grad():
            inputs = _real_inputs(captured, examples)
            kernels, measures = faster_kernels(captured, compile_kernels(captured), inputs, device)
            reprice_costs = settings.cost_model == "profile"
            traffic = memory_traffic(device) if reprice_costs else None
        graph = priced_graph(captured, kernels, measures, traffic=traffic)
        copies = sum(
            _bytes(value) for node, value in zip(_placeholders(captured), inputs, strict=True) if node in mutated
        )
        graph = dataclasses.replace(graph, fixed_memory=graph.fixed_memory + copies)
        captured = dataclasses.replace(
            captured, graph=graph, cost_model="profile" if reprice_costs else captured.cost_model
        )
        if settings.offload is not None:
            captured = with_host_link(captured, settings.offload)
            graph = captured.graph
        no_remat = solve(graph, None, method="checkpoint_all")
        budget = resolve_budget(settings.budget, no_remat.peak_memory)
        solve_started = time.perf_counter()
        try:
            plan = self._solve(captured, budget, settings.solve_options, started)
        except InfeasibleBudget as error:
            if not isinstance(parse_budget(settings.budget), float) or error.minimum is None:
                raise
            log.warning(
                "region %d cannot reach %.0f%% of its peak without recomputation (%s); it is planned at the smallest "
                "budget known to fit, %s (%.0f%%)",
                index,
                100 * budget / no_remat.peak_memory,
                format_bytes(budget),
                format_bytes(error.minimum),
                100 * error.minimum / no_remat.peak_memory,
            )
            budget = error.minimum
            # the fallback gets what is left of the region's `time_limit`, counted from the first solve
            options = settings.solve_options
            left = solving.options_within(settings.method, options, options.get("time_limit"), solve_started)
            plan = self._solve(captured, budget, left, started)
        region = PlannedRegion(index, graph.size, budget, no_remat.peak_memory, plan, no_remat.cost)
        self.regions.append(region)
        log.log(
            logging.WARNING if index else logging.INFO,
            "region %d planned%s: %d nodes, budget %s, planned peak %s (no recomputation %s), compute %+.1f%%",
            index,
            " (a graph break: it has its own budget)" if index else "",
            graph.size,
            format_bytes(budget),
            format_bytes(plan.peak_memory),
            format_bytes(no_remat.peak_memory),
            100 * (plan.cost / no_remat.cost - 1) if no_remat.cost else 0.0,
        )
        steps = region_steps(schedule_of(graph, plan), kernels, leaving_values(captured), region.copier)
        return split_schedule(captured, kernels, steps, fake_mode=fake_mode, mutated_inputs=mutated)

    def _solve(self, captured: Captured, budget: int, options: dict[str, Any], started: float) -> Plan:
        """The region's plan within `budget` bytes, from the disk cache when possible, its search within what is left
        of the planning time counted from `started`."""
        settings = self.settings
        return solving.cached_solve(
            captured.graph,
            budget,
            method=settings.method,
            options=solving.options_within(settings.method, options, settings.planning_time_limit, started),
            cost_model=captured.cost_model,
            device=captured.device,
            cache=settings.cache,
        )


def backend(
    budget: int | float | str,
    *,
    method: str = "optimal",
    cost_model: BackendCostModel = "profile",
    planning_time_limit: float | None = None,
    cache: bool = True,
    host_budget: int | str | None = None,
    host_link: LinkSpeeds | None = None,
    **solve_options: Any,
) -> CheckmateBackend:
    """A `torch.compile` backend that runs each compiled region's forward and backward within `budget`.

    Args:
        budget: bytes (an int or a string such as "8GiB"): a limit, and a region that cannot fit in it raises
            `InfeasibleBudget` naming the smallest budget that fits (wrapped by Dynamo in `BackendCompilerFailed`).
            Or a float in (0, 1]: that fraction of each region's peak with no recomputation, as low as the region
            goes: a region that cannot reach it is planned at the smallest budget known to fit, with a warning.
        method: a strategy name from `checkmate methods`.
        cost_model: "profile" prices nodes by their compiled functions' measured time; "flops" by FLOPs.
        planning_time_limit: seconds for all of one region's planning: compiling and measuring its nodes and every
            solve. Each solve gets what is left of it, or its own `time_limit` if that is less; when compiling and
            measuring take all of it, the solve gets no time and the region raises InfeasibleBudget unless its
            first baselines fit. None (the default): no limit beyond `time_limit`.
        cache: reuse plans and node measures cached on disk (`$CHECKMATE_CACHE_DIR`, default `~/.cache/checkmate`),
            as `checkmate.compile` does: a second run of the same model plans each region from the cache, without
            solving. With False nothing is read from or written to the disk caches.
        host_budget: let each region's plan move values to host memory and back beside recomputing them, holding at
            most this many bytes there (an int, or a string such as "64GiB"), as `checkmate.compile` does; None (the
            default): no moves, unless `host_link` is given (then host memory is not limited).
        host_link: the link's speeds for planning moves (`checkmate.LinkSpeeds`); None: measured on the region's
            device at first use and cached.
        **solve_options: options of the method, such as `time_limit=60`: the seconds for each region's search,
            a fraction's fallback to the smallest budget known to fit included. As for `checkmate.compile`,
            "optimal" and "approx" default to a time limit of DEFAULT_TIME_LIMIT and "optimal" stops once its plan
            is proven within DEFAULT_GAP of its lower bound, or once that gap has not closed for DEFAULT_STALL_TIME
            seconds (`checkmate.search_defaults`; pass `mip_gap=1e-4, stall_time=None` to search on). Compiling
            and measuring show progress lines, and the search too, every 5 s (`progress_interval`);
            `progress=False` silences them (`checkmate.progress_lines`). Ctrl-C during the search ends it with the
            best plan so far; Ctrl-C again, or while compiling, raises KeyboardInterrupt.

    Example:
        >>> model = torch.compile(model, backend=checkmate.backend(budget=0.5, time_limit=30))
        >>> loss_fn(model(x), y).backward()
    """
    check_solve_options(method, solve_options)
    check_choice("cost_model", cost_model, BackendCostModel)
    solving.check_planning_time_limit(planning_time_limit)
    resolve_budget(budget, 1)
    offload = host_offload(host_budget, host_link)
    return CheckmateBackend(
        BackendSettings(
            budget,
            method,
            cost_model,
            with_search_defaults(method, solve_options),
            planning_time_limit=planning_time_limit,
            cache=cache,
            offload=offload,
        )
    )


def _run_as_built(gm: torch.fx.GraphModule, example_inputs: Sequence[Any]) -> Any:
    """The partition's graphs already call compiled functions: run them as they are, with the boxed calling
    convention (the graph takes the argument list and clears it), so an input dies after its last reader, as the
    plan says, instead of when the whole graph returns."""
    gm.graph.set_codegen(_BoxedCodeGen())
    gm.recompile()

    def run(arguments: list[Any]) -> Any:
        return gm(arguments)

    run._boxed_call = True  # type: ignore[attr-defined]
    return run


def _inductor(gm: torch.fx.GraphModule, example_inputs: Sequence[Any]) -> Any:
    """A region without gradients (inference): Inductor compiles it as `torch.compile` would, without a plan.

    `compile_fx` returns a function called with the arguments themselves, as Dynamo calls a backend's function, but
    it carries the `_boxed_call` mark of a function it wraps, so AOTAutograd would pass it the argument list as one
    argument: it is called here with the list unpacked (and the list emptied, as the boxed convention asks)."""
    function: Callable[..., Any] = compile_fx(gm, list(example_inputs))  # type: ignore[assignment]

    def run(arguments: list[Any]) -> Any:
        values = list(arguments)
        arguments.clear()
        return function(*values)

    run._boxed_call = True  # type: ignore[attr-defined]
    return run


def _placeholders(captured: Captured) -> list[str]:
    return [node.name for node in captured.module.graph.nodes if node.op == "placeholder"]


def _bytes(value: Any) -> int:
    return value.untyped_storage().nbytes() if isinstance(value, torch.Tensor) else 0


def _mutated_inputs(
    joint: torch.fx.GraphModule, mutation_count: int, gradients: Sequence[str | None]
) -> frozenset[str]:
    """Primals the region may change in place. AOTAutograd returns the new values of mutated inputs first among the
    forward outputs (`mutation_count` of them); each is made by an op that reads the input it replaces. Taken are the
    primals without a gradient that such an op reads with the new value's shape and dtype: a superset when an op
    reads several alike (BatchNorm's running mean and variance), never less."""
    placeholders = [node for node in joint.graph.nodes if node.op == "placeholder"]
    primals = [node for node in placeholders if not node.name.startswith("tangents")]
    without_gradient = {node.name for node, gradient in zip(primals, gradients, strict=False) if gradient is None}
    output = next(node for node in joint.graph.nodes if node.op == "output")
    mutated: set[str] = set()
    for value in output.args[0][:mutation_count]:
        producer = value.args[0] if value.target is operator.getitem else value
        new = value.meta.get("val")
        for argument in producer.all_input_nodes:
            old = argument.meta.get("val")
            if (
                argument.name in without_gradient
                and isinstance(old, torch.Tensor)
                and isinstance(new, torch.Tensor)
                and old.shape == new.shape
                and old.dtype == new.dtype
            ):
                mutated.add(argument.name)
    return frozenset(mutated)


def _device(examples: Sequence[Any]) -> torch.device:
    for value in examples:
        if isinstance(value, torch.Tensor):
            return value.device
    return torch.device("cpu")


def _real_inputs(captured: Captured, examples: Sequence[Any]) -> list[Any]:
    """Real tensors for the joint graph's placeholders: the region's example inputs for the primals, zeros of the
    traced layout for the tangents (only their layout and the time of what reads them matter to the measures)."""
    placeholders = [node for node in captured.module.graph.nodes if node.op == "placeholder"]
    inputs: list[Any] = []
    for position, node in enumerate(placeholders):
        value = node.meta.get("val")
        example = examples[position] if position < len(examples) else None
        if (
            isinstance(example, torch.Tensor)
            and isinstance(value, torch.Tensor)
            and example.shape == value.shape
            and example.dtype == value.dtype
        ):
            inputs.append(example.detach())
        else:
            inputs.append(example_value(node))
    return inputs
