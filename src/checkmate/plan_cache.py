"""Plans on disk: an automatic cache keyed by what determines a plan, and explicit save and load.

The cache key is the sha256 of the graph (its JSON; without the costs when they were profiled, since timings differ
from run to run while the structure and sizes do not: a profiled recompute cost is then keyed by its presence
alone), the budget in bytes, the method, its options, the cost model and the device. The directory is `plans/` in
the cache folder (`checkmate.disk_cache.cache_root`: `$CHECKMATE_CACHE_DIR`, else `~/.cache/checkmate`). A cached
plan is re-simulated on the current graph and budget when loaded: a damaged entry, or one that does not fit (made
for another graph, or over this budget), is logged as a warning naming its file, removed, and the plan solved again.
A cache that cannot be written is logged, and the plan is returned uncached.

The effort options (`time_limit`, `mip_gap`, `stall_time`) are not in the key: they say how hard to look, not which
problem. An entry keeps the effort that made it. A plan proven optimal serves any later call; an unproven one (a time
limit ran out, or the search stalled) serves only calls that ask for no more effort than it had, and the log says it is
not proven. A solve that Ctrl-C stopped is recorded with the seconds it searched, not the limit it was given. A call
that asks for more time or a smaller gap solves again, and the cheaper of the two plans is kept.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from checkmate.byte_sizes import format_bytes
from checkmate.disk_cache import cache_root
from checkmate.errors import CheckmateError, InvalidSchedule
from checkmate.files import write_file
from checkmate.graph import Graph
from checkmate.options import CostModel
from checkmate.plan import Plan

log = logging.getLogger(__name__)

FORMAT = "checkmate-plan/1"
EFFORT_OPTIONS = ("time_limit", "mip_gap", "stall_time")


def cache_directory() -> Path:
    """Where cached plans live: `plans/` in the cache folder (`$CHECKMATE_CACHE_DIR`, else `~/.cache/checkmate`)."""
    return cache_root() / "plans"


def graph_fingerprint(graph: Graph, *, cost_model: CostModel) -> str:
    """sha256 of the graph JSON, without profiled costs (they vary from run to run; the plan stays valid). Which
    nodes have a recompute cost of their own stays in it: that changes the problem, not only its figures."""
    data = json.loads(graph.to_json())
    if cost_model == "profile":
        for node in data["nodes"]:
            node.pop("cost")
            if "recompute_cost" in node:
                node["recompute_cost"] = True
    text = json.dumps({"graph": data, "cost_model": cost_model}, sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()


def plan_key(
    graph: Graph, *, budget: int | None, method: str, options: dict[str, Any], cost_model: CostModel, device: str
) -> str:
    """The cache key of a plan: everything that decides which problem `solve` solves (not how hard it tries)."""
    text = json.dumps(
        {
            "graph": graph_fingerprint(graph, cost_model=cost_model),
            "budget": budget,
            "method": method,
            "options": {name: value for name, value in options.items() if name not in EFFORT_OPTIONS},
            "device": device,
        },
        sort_keys=True,
        default=repr,
    )
    return hashlib.sha256(text.encode()).hexdigest()


@dataclass(frozen=True)
class CachedPlan:
    """A cache entry: the plan and the effort (time_limit, mip_gap, stall_time) of the solve that found it."""

    plan: Plan
    effort: dict[str, float | None]

    def serves(self, options: Mapping[str, Any]) -> bool:
        """Whether this plan answers a call with `options`: proven optimal, or found with at least the effort the
        call asks for."""
        return self.plan.status == "optimal" or _covers(self.effort, _effort(options))


def cached_solve(
    key: str,
    graph: Graph,
    *,
    cost_model: CostModel,
    budget: int | None,
    options: Mapping[str, Any],
    solve: Callable[[], Plan],
    searches: bool = True,
    interrupted: Callable[[], bool] = lambda: False,
) -> Plan:
    """The cached plan for `key` when it fits `budget` and serves `options`; else `solve()`, cached (the cheaper of
    the new plan and an unproven cached one, with the greater of their efforts). `searches`: the method searches
    until a time limit, a gap or a stall (it takes `time_limit`), so one that returns earlier was stopped
    (`spent_effort`); a method that does not search always has its full effort. `interrupted()` says, after
    `solve()`, whether Ctrl-C stopped it (without it, a search that asked for `stall_time` and returned early is
    taken to have stalled)."""
    entry = load_cached(key, graph, cost_model=cost_model, budget=budget)
    if entry is not None and entry.serves(options):
        if entry.plan.status != "optimal":
            log.info(
                "using the cached plan for key %s, which is not proven optimal (found with %s); ask for a longer "
                "time_limit to search further",
                key[:12],
                _describe(entry.effort),
            )
        return entry.plan
    if entry is not None:
        log.info(
            "the cached plan is not proven optimal and was found with %s; this call asks for %s: solving again",
            _describe(entry.effort),
            _describe(_effort(options)),
        )
    plan = solve()
    effort = spent_effort(plan, options, interrupted()) if searches else _effort(options)
    if entry is not None:
        effort = _greater(entry.effort, effort)
        if entry.plan.cost < plan.cost:
            plan = entry.plan
    store_cached(key, plan, graph, cost_model=cost_model, effort=effort)
    return plan


def load_cached(key: str, graph: Graph, *, cost_model: CostModel, budget: int | None = None) -> CachedPlan | None:
    """The cache entry for `key`, or None when there is none, or when it is damaged or does not fit `graph` and
    `budget` (then logged, and the file removed)."""
    path = cache_directory() / f"{key}.json"
    if not path.exists():
        return None
    try:
        document = _document(path)
        plan = _plan_of(document, path, graph, cost_model=cost_model, budget=budget)
        effort = _stored_effort(document, path)
    except (OSError, ValueError, CheckmateError) as error:  # unreadable, not JSON, damaged, foreign or stale
        log.warning("ignoring the cached plan %s (removing it): %s; solving again", path, error)
        with contextlib.suppress(OSError):  # an unwritable cache: storing the new plan will fail and say so
            path.unlink(missing_ok=True)
        return None
    log.info("loaded the cached plan %s (%s)", path, plan.status)
    return CachedPlan(plan, effort)


def store_cached(
    key: str, plan: Plan, graph: Graph, *, cost_model: CostModel, effort: Mapping[str, float | None]
) -> Path | None:
    """Write `plan` into the cache under `key` with the effort that found it (`spent_effort`); returns the file, or
    None when the cache cannot be written (logged: the plan is still good, only not cached)."""
    path = cache_directory() / f"{key}.json"
    try:
        write_plan(path, plan, graph, cost_model=cost_model, effort=effort)
    except OSError as error:
        log.warning("cannot write the plan cache %s (%s): continuing without caching this plan", path, error)
        return None
    log.info("cached the plan as %s", path)
    return path


def spent_effort(plan: Plan, options: Mapping[str, Any], interrupted: bool = False) -> dict[str, float | None]:
    """The effort of the solve that returned `plan` when asked for `options`: the effort asked for, except that a
    search that stopped before its time limit (`plan.solve_time`) without proving the plan optimal or within its
    `mip_gap` (`plan.status`, `plan.gap`), and not because it stalled (it asked for no `stall_time`, or it was
    `interrupted`), is taken to have had only the seconds it ran: a call that asks for more time must not reuse its
    plan."""
    effort = _effort(options)
    limit, gap = effort["time_limit"], effort["mip_gap"]
    reached_gap = plan.status == "optimal" or (plan.gap is not None and plan.gap <= (gap or 0.0))
    stalled = effort["stall_time"] is not None and not interrupted
    if not reached_gap and not stalled and (limit is None or plan.solve_time < limit):
        effort["time_limit"] = plan.solve_time
    return effort


def _greater(one: Mapping[str, float | None], other: Mapping[str, float | None]) -> dict[str, float | None]:
    """The effort of two solves together: the longer time and stall time (None: unlimited) and the smaller gap
    (None: the solver's default, the loosest)."""
    gaps = [gap for gap in (one["mip_gap"], other["mip_gap"]) if gap is not None]
    return {
        "time_limit": _longer(one["time_limit"], other["time_limit"]),
        "mip_gap": min(gaps) if gaps else None,
        "stall_time": _longer(one["stall_time"], other["stall_time"]),
    }


def _longer(one: float | None, other: float | None) -> float | None:
    """The longer of two limits in seconds, None being no limit."""
    return None if one is None or other is None else max(one, other)


def _effort(options: Mapping[str, Any]) -> dict[str, float | None]:
    """The effort options as numbers (None: no limit on time, the solver's default gap)."""
    return {name: None if options.get(name) is None else float(options[name]) for name in EFFORT_OPTIONS}


def _covers(had: Mapping[str, float | None], asked: Mapping[str, float | None]) -> bool:
    """Whether a solve with effort `had` tried at least as hard as `asked` (no time limit beats any; a smaller gap
    is more effort)."""
    gap_had, gap_asked = had["mip_gap"], asked["mip_gap"]
    small_enough_gap = gap_asked is None or (gap_had is not None and gap_had <= gap_asked)
    return (
        _as_long(had["time_limit"], asked["time_limit"])
        and small_enough_gap
        and _as_long(had["stall_time"], asked["stall_time"])
    )


def _as_long(had: float | None, asked: float | None) -> bool:
    """Whether a limit of `had` seconds is at least `asked` (None: no limit, longer than any)."""
    return had is None or (asked is not None and had >= asked)


def _describe(effort: Mapping[str, float | None]) -> str:
    parts = ["no time limit" if effort["time_limit"] is None else f"time_limit={effort['time_limit']:g} s"]
    if effort["mip_gap"] is not None:
        parts.append(f"mip_gap={effort['mip_gap']:g}")
    if effort["stall_time"] is not None:
        parts.append(f"stall_time={effort['stall_time']:g} s")
    return ", ".join(parts)


def write_plan(
    path: str | os.PathLike[str],
    plan: Plan,
    graph: Graph,
    *,
    cost_model: CostModel,
    effort: Mapping[str, float | None] | None = None,
) -> None:
    """Save `plan` with the fingerprint of the graph it was made for and the effort that found it (atomically)."""
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    document = {
        "format": FORMAT,
        "graph": graph_fingerprint(graph, cost_model=cost_model),
        "plan": json.loads(plan.to_json()),
        "effort": dict(effort) if effort is not None else _effort({}),
    }
    write_file(target, json.dumps(document))


def read_plan(path: str | os.PathLike[str], graph: Graph, *, cost_model: CostModel, budget: int | None = None) -> Plan:
    """Load a plan saved by `write_plan` for `graph`, checked by simulation to fit `budget` bytes (None: any peak).

    Raises:
        CheckmateError: the file is not a checkmate plan, or it was made for another graph.
        InvalidSchedule: the plan breaks a constraint on this graph, or its peak is over `budget`.
    """
    return _plan_of(_document(path), path, graph, cost_model=cost_model, budget=budget)


def _document(path: str | os.PathLike[str]) -> Any:
    return json.loads(Path(path).read_text())


def _plan_of(
    document: Any, path: str | os.PathLike[str], graph: Graph, *, cost_model: CostModel, budget: int | None
) -> Plan:
    """The plan in a document `write_plan` wrote, checked to be for `graph` and to fit `budget` (see `read_plan`)."""
    if not isinstance(document, dict) or document.get("format") != FORMAT:
        raise CheckmateError(f"{path} is not a checkmate plan file (format {FORMAT!r})")
    if document.get("graph") != graph_fingerprint(graph, cost_model=cost_model):
        raise CheckmateError(
            f"{path} holds a plan for another graph (a different model, batch shape or cost model): "
            "compile again to make a plan for this one"
        )
    stored = document.get("plan")
    if not isinstance(stored, dict) or not isinstance(stored.get("method"), str):
        raise CheckmateError(f"{path} is damaged: it has no plan")
    for matrix in ("R", "S"):
        if not isinstance(stored.get(matrix), list):
            raise CheckmateError(f"{path} is damaged: its plan has no {matrix} matrix")
    plan = Plan.from_json(json.dumps(stored), graph)  # simulated; a matrix of another size raises ValueError (reshape)
    if budget is not None and plan.peak_memory > budget:
        raise InvalidSchedule(
            f"{path} holds a plan that peaks at {format_bytes(plan.peak_memory)}, over the budget of "
            f"{format_bytes(budget)}: it was made for a larger budget; plan again within this one"
        )
    return plan


def _stored_effort(document: dict[str, Any], path: str | os.PathLike[str]) -> dict[str, float | None]:
    effort = document.get("effort", {})
    if not isinstance(effort, dict) or not all(
        value is None or (isinstance(value, int | float) and not isinstance(value, bool)) for value in effort.values()
    ):
        raise CheckmateError(f"{path} is damaged: its effort is not a table of numbers")
    return _effort(effort)
