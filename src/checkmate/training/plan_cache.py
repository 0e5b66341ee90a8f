"""Plans on disk: an automatic cache keyed by what determines a plan, and explicit save and load.

The cache key is the sha256 of the graph (its JSON; without the costs when they were profiled, since
timings differ from run to run while the structure and sizes do not), the budget in bytes, the method,
its options, the cost model and the device. The directory is `~/.cache/checkmate/plans`, or
`$CHECKMATE_CACHE_DIR` when set. A cached plan is re-simulated on the current graph when loaded, so a
stale or corrupt entry is reported and ignored, never used.

The effort options (`time_limit`, `mip_gap`) are not in the key: they say how hard to look, not which problem.
An entry keeps the effort that made it. A plan proven optimal serves any later call; an unproven one (a time
limit ran out) serves only calls that ask for no more effort than it had, and the log says it is not proven. A
call that asks for more time or a smaller gap solves again, and the cheaper of the two plans is kept.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from checkmate.errors import CheckmateError
from checkmate.graph import Graph
from checkmate.plan import Plan

log = logging.getLogger(__name__)

FORMAT = "checkmate-plan/1"
EFFORT_OPTIONS = ("time_limit", "mip_gap")


def cache_directory() -> Path:
    """Where cached plans live: `$CHECKMATE_CACHE_DIR`, else `~/.cache/checkmate/plans`."""
    configured = os.environ.get("CHECKMATE_CACHE_DIR")
    return Path(configured) if configured else Path.home() / ".cache" / "checkmate" / "plans"


def graph_fingerprint(graph: Graph, *, cost_model: str) -> str:
    """sha256 of the graph JSON, without profiled costs (they vary from run to run; the plan stays valid)."""
    data = json.loads(graph.to_json())
    if cost_model == "profile":
        for node in data["nodes"]:
            node.pop("cost")
    text = json.dumps({"graph": data, "cost_model": cost_model}, sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()


def plan_key(
    graph: Graph, *, budget: int | None, method: str, options: dict[str, Any], cost_model: str, device: str
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
    """A cache entry: the plan and the effort (time_limit, mip_gap) of the solve that found it."""

    plan: Plan
    effort: dict[str, float | None]

    def serves(self, options: Mapping[str, Any]) -> bool:
        """Whether this plan answers a call with `options`: proven optimal, or found with at least the effort the
        call asks for."""
        return self.plan.status == "optimal" or _covers(self.effort, _effort(options))


def cached_solve(
    key: str, graph: Graph, *, cost_model: str, options: Mapping[str, Any], solve: Callable[[], Plan]
) -> Plan:
    """The cached plan for `key` when it serves `options`; else `solve()`, cached (the cheaper of the new plan and
    an unproven cached one, under the new effort)."""
    entry = load_cached(key, graph, cost_model=cost_model)
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
    if entry is not None and entry.plan.cost < plan.cost:
        plan = entry.plan
    store_cached(key, plan, graph, cost_model=cost_model, options=options)
    return plan


def load_cached(key: str, graph: Graph, *, cost_model: str) -> CachedPlan | None:
    """The cache entry for `key`, or None when there is none or it no longer fits `graph` (then logged)."""
    path = cache_directory() / f"{key}.json"
    if not path.exists():
        return None
    try:
        document = _document(path)
        plan = _plan_of(document, path, graph, cost_model=cost_model)
        effort = _stored_effort(document, path)
    except (OSError, ValueError, CheckmateError) as error:  # unreadable, not JSON, damaged, foreign or stale
        log.warning("ignoring the cached plan %s: %s", path, error)
        return None
    log.info("loaded the cached plan %s (%s)", path, plan.status)
    return CachedPlan(plan, effort)


def store_cached(key: str, plan: Plan, graph: Graph, *, cost_model: str, options: Mapping[str, Any]) -> Path:
    """Write `plan` into the cache under `key` with the effort in `options` that found it; returns the file."""
    path = cache_directory() / f"{key}.json"
    write_plan(path, plan, graph, cost_model=cost_model, effort=_effort(options))
    log.info("cached the plan as %s", path)
    return path


def _effort(options: Mapping[str, Any]) -> dict[str, float | None]:
    """The effort options as numbers (None: no limit on time, the solver's default gap)."""
    return {name: None if options.get(name) is None else float(options[name]) for name in EFFORT_OPTIONS}


def _covers(had: Mapping[str, float | None], asked: Mapping[str, float | None]) -> bool:
    """Whether a solve with effort `had` tried at least as hard as `asked` (no time limit beats any; a smaller gap
    is more effort)."""
    time_had, time_asked = had["time_limit"], asked["time_limit"]
    enough_time = time_had is None or (time_asked is not None and time_had >= time_asked)
    gap_had, gap_asked = had["mip_gap"], asked["mip_gap"]
    small_enough_gap = gap_asked is None or (gap_had is not None and gap_had <= gap_asked)
    return enough_time and small_enough_gap


def _describe(effort: Mapping[str, float | None]) -> str:
    time_limit = "no time limit" if effort["time_limit"] is None else f"time_limit={effort['time_limit']:g} s"
    return time_limit if effort["mip_gap"] is None else f"{time_limit}, mip_gap={effort['mip_gap']:g}"


def write_plan(
    path: str | os.PathLike[str],
    plan: Plan,
    graph: Graph,
    *,
    cost_model: str,
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
    temporary = target.with_name(f".{target.name}.{os.getpid()}.tmp")
    temporary.write_text(json.dumps(document))
    os.replace(temporary, target)


def read_plan(path: str | os.PathLike[str], graph: Graph, *, cost_model: str) -> Plan:
    """Load a plan saved by `write_plan` for `graph`.

    Raises:
        CheckmateError: the file is not a checkmate plan, or it was made for another graph.
        InvalidSchedule: the plan breaks a constraint on this graph.
    """
    return _plan_of(_document(path), path, graph, cost_model=cost_model)


def _document(path: str | os.PathLike[str]) -> Any:
    return json.loads(Path(path).read_text())


def _plan_of(document: Any, path: str | os.PathLike[str], graph: Graph, *, cost_model: str) -> Plan:
    """The plan in a document `write_plan` wrote, checked to be for `graph` (see `read_plan`)."""
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
    return Plan.from_json(json.dumps(stored), graph)  # a matrix of another size raises ValueError (reshape)


def _stored_effort(document: dict[str, Any], path: str | os.PathLike[str]) -> dict[str, float | None]:
    effort = document.get("effort", {})
    if not isinstance(effort, dict) or not all(
        value is None or (isinstance(value, int | float) and not isinstance(value, bool)) for value in effort.values()
    ):
        raise CheckmateError(f"{path} is damaged: its effort is not a table of numbers")
    return _effort(effort)
