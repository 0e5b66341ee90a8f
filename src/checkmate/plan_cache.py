"""Plans on disk: an automatic cache keyed by what determines a plan, and explicit save and load.

The cache key is the sha256 of the graph (its JSON; without the costs when they were profiled, since
timings differ from run to run while the structure and sizes do not), the budget in bytes, the method,
its options, the cost model and the device. The directory is `~/.cache/checkmate/plans`, or
`$CHECKMATE_CACHE_DIR` when set. A cached plan is re-simulated on the current graph when loaded, so a
stale or corrupt entry is reported and ignored, never used.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
from pathlib import Path
from typing import Any

from checkmate.errors import CheckmateError
from checkmate.graph import Graph
from checkmate.plan import Plan

log = logging.getLogger(__name__)

FORMAT = "checkmate-plan/1"


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
    """The cache key of a plan: everything that decides which plan `solve` returns."""
    text = json.dumps(
        {
            "graph": graph_fingerprint(graph, cost_model=cost_model),
            "budget": budget,
            "method": method,
            "options": options,
            "device": device,
        },
        sort_keys=True,
        default=repr,
    )
    return hashlib.sha256(text.encode()).hexdigest()


def load_cached(key: str, graph: Graph, *, cost_model: str) -> Plan | None:
    """The cached plan for `key`, or None when there is none or it no longer fits `graph`."""
    path = cache_directory() / f"{key}.json"
    if not path.exists():
        return None
    try:
        plan = read_plan(path, graph, cost_model=cost_model)
    except (CheckmateError, ValueError, KeyError, OSError) as error:
        log.warning("ignoring the cached plan %s: %s", path, error)
        return None
    log.info("loaded the cached plan %s", path)
    return plan


def store_cached(key: str, plan: Plan, graph: Graph, *, cost_model: str) -> Path:
    """Write `plan` into the cache under `key`; returns the file."""
    path = cache_directory() / f"{key}.json"
    write_plan(path, plan, graph, cost_model=cost_model)
    log.info("cached the plan as %s", path)
    return path


def write_plan(path: str | os.PathLike[str], plan: Plan, graph: Graph, *, cost_model: str) -> None:
    """Save `plan` with the fingerprint of the graph it was made for (written atomically)."""
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    document = {
        "format": FORMAT,
        "graph": graph_fingerprint(graph, cost_model=cost_model),
        "plan": json.loads(plan.to_json()),
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
    document = json.loads(Path(path).read_text())
    if not isinstance(document, dict) or document.get("format") != FORMAT:
        raise CheckmateError(f"{path} is not a checkmate plan file (format {FORMAT!r})")
    if document["graph"] != graph_fingerprint(graph, cost_model=cost_model):
        raise CheckmateError(
            f"{path} holds a plan for another graph (a different model, batch shape or cost model): "
            "compile again to make a plan for this one"
        )
    return Plan.from_json(json.dumps(document["plan"]), graph)
