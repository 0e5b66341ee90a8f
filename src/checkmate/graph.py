"""The training graph: ops in execution order, each with a compute cost and an output size.

This is the paper's G = (V, E): node i may only read nodes j < i, so the list order is a
topological order and node indices double as the frontier-advancing stage numbers.
"""

from __future__ import annotations

import dataclasses
import json
import math
from dataclasses import dataclass
from functools import cached_property
from typing import Any

import numpy as np

from checkmate.errors import InvalidGraph
from checkmate.fetched import FetchedValue, fetch_bytes
from checkmate.moved import HostLink


@dataclass(frozen=True)
class Node:
    """One op of the training step.

    Attributes:
        name: a label, unique within the graph.
        cost: compute cost of one evaluation (any unit, float >= 0).
        memory: bytes of the op's output (int >= 0).
        backward: True for ops of the backward pass (and the loss gradient seed).
        inputs: indices of the nodes whose outputs this op reads; all smaller than its own index.
        workspace: bytes the op holds only while it runs, beyond its inputs and output (int >= 0): temporaries
            of an op that stands for several framework ops. They count in the peak at the moment it runs.
        recompute_workspace: the same when the op is recomputed (a stage after its own); None means `workspace`.
            They differ when the op makes values that leave the step, such as a parameter gradient: the first
            run's copy is counted in the fixed memory (or in `retained`), a recomputation's copy is a temporary.
        retained: bytes the op's first run leaves alive until the step ends, outside the plan's control: the
            parameter gradients it makes when `.grad` starts each step empty, and the random generator state a
            random op saves to replay when recomputed. They count from the moment the op first runs (its stage)
            to the end, in every peak.
        recompute_cost: compute cost of a recomputation (a stage after its own); None means `cost`. Lower where a
            recomputation runs inside the kernel of the op that reads it, which then neither writes nor reads the
            value from memory (`checkmate.inductor.pricing`). A plan's cost prices the run in the op's own stage
            at `cost` and every later run at this (`checkmate.simulate.plan_cost`).
    """

    name: str
    cost: float
    memory: int
    backward: bool = False
    inputs: tuple[int, ...] = ()
    workspace: int = 0
    recompute_workspace: int | None = None
    retained: int = 0
    recompute_cost: float | None = None


@dataclass(frozen=True)
class Graph:
    """A validated training graph.

    Attributes:
        nodes: the ops in execution order.
        fixed_memory: bytes held for the whole step (parameters, inputs, and gradients unless the nodes that make
            them retain them); counted in every peak.
        stage_held: empty, or per stage t, bytes held outside the plan throughout stage t beside the fixed memory
            and what nodes retain: what a sharded step's units hold then (`checkmate.sharded.memory.SolverExtras`).
            Counted in every moment of the stage, through `retained_through`.
        opening_held: empty, or per stage t, bytes held outside the plan only at the start of stage t, before its
            first computation, beside all else held then (`held_before_stage` and the values the plan holds into
            it): what a sharded step's reduce-scatters between two stages hold
            (`checkmate.sharded.memory.SolverExtras`).
        fetched: values held elsewhere and fetched for the nodes that read them (an FSDP2 unit's parameters): a
            plan decides in which stages each is present (`checkmate.fetched`).
        fetch_overlap: the fraction of a stage's compute that the fetches of the next stage run beside, hidden
            (0: every fetch adds its time to the step; `checkmate.fetched`); more than 0 only when `prefetch`.
        prefetch: whether each fetch starts in the stage before the one its value becomes present in, holding the
            value's bytes there too (`checkmate.fetched`).
        host_link: the link to host memory, when a plan may move nodes' outputs there and back (`checkmate.moved`).
    """

    nodes: tuple[Node, ...]
    fixed_memory: int = 0
    stage_held: tuple[int, ...] = ()
    opening_held: tuple[int, ...] = ()
    fetched: tuple[FetchedValue, ...] = ()
    fetch_overlap: float = 0.0
    prefetch: bool = False
    host_link: HostLink | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "nodes", tuple(self.nodes))
        object.__setattr__(self, "stage_held", tuple(self.stage_held))
        object.__setattr__(self, "opening_held", tuple(self.opening_held))
        object.__setattr__(self, "fetched", tuple(self.fetched))
        _validate(self)

    @property
    def size(self) -> int:
        """Number of nodes, the paper's n (and T, the number of stages)."""
        return len(self.nodes)

    @cached_property
    def costs(self) -> np.ndarray:
        """float64[n]: compute cost of each node."""
        return np.array([node.cost for node in self.nodes], dtype=np.float64)

    @cached_property
    def least_cost(self) -> float:
        """The cost no plan goes below: every node once, and every fetched value fetched and released once when no
        fetch or release can hide behind compute (`checkmate.fetched`)."""
        exposed = (
            sum(value.fetch_cost + value.release_cost for value in self.fetched) if self.fetch_overlap == 0 else 0.0
        )
        return float(self.costs.sum()) + exposed

    @cached_property
    def recompute_costs(self) -> np.ndarray:
        """float64[n]: compute cost of each node when recomputed (a stage after its own)."""
        return np.array(
            [node.cost if node.recompute_cost is None else node.recompute_cost for node in self.nodes],
            dtype=np.float64,
        )

    @cached_property
    def memory(self) -> np.ndarray:
        """int64[n]: output bytes of each node."""
        return np.array([node.memory for node in self.nodes], dtype=np.int64)

    @cached_property
    def workspace(self) -> np.ndarray:
        """int64[n]: transient bytes of each node while it runs."""
        return np.array([node.workspace for node in self.nodes], dtype=np.int64)

    @cached_property
    def recompute_workspace(self) -> np.ndarray:
        """int64[n]: transient bytes of each node while it is recomputed."""
        return np.array(
            [node.workspace if node.recompute_workspace is None else node.recompute_workspace for node in self.nodes],
            dtype=np.int64,
        )

    @cached_property
    def retained(self) -> np.ndarray:
        """int64[n]: bytes each node's first run leaves alive to the end of the step."""
        return np.array([node.retained for node in self.nodes], dtype=np.int64)

    @cached_property
    def retained_through(self) -> np.ndarray:
        """int64[n]: bytes nodes 0..t retain, held from the moment node t first runs (cumulative `retained`), plus
        what stage t holds outside the plan (`stage_held`)."""
        held = np.cumsum(self.retained).astype(np.int64)
        return held + np.array(self.stage_held, dtype=np.int64) if self.stage_held else held

    @cached_property
    def held_before_stage(self) -> np.ndarray:
        """int64[n]: bytes outside the plan held throughout stage t until node t first runs: the fixed memory, what
        nodes 0..t-1 retain and what the stage holds (`stage_held`). While node t runs in its own stage, and after,
        add `retained[t]`."""
        return self.fixed_memory + self.retained_through - self.retained

    @cached_property
    def held_at_opening(self) -> np.ndarray:
        """int64[n]: bytes outside the plan held at the start of stage t beside `held_before_stage` (`opening_held`;
        zeros without it)."""
        return np.array(self.opening_held or [0] * len(self.nodes), dtype=np.int64)

    @cached_property
    def is_backward(self) -> np.ndarray:
        """bool[n]: which nodes belong to the backward pass."""
        return np.array([node.backward for node in self.nodes], dtype=bool)

    @cached_property
    def edges(self) -> np.ndarray:
        """int64[m, 2]: the (source, destination) pairs, sorted by destination then source."""
        pairs = sorted(
            {(src, dst) for dst, node in enumerate(self.nodes) for src in node.inputs}, key=lambda e: (e[1], e[0])
        )
        return np.array(pairs, dtype=np.int64).reshape(-1, 2)

    @cached_property
    def predecessors(self) -> tuple[tuple[int, ...], ...]:
        """For each node, its distinct inputs in increasing order (the paper's DEPS[k])."""
        return tuple(tuple(sorted(set(node.inputs))) for node in self.nodes)

    @cached_property
    def users(self) -> tuple[tuple[int, ...], ...]:
        """For each node, the nodes that read it, in increasing order (the paper's USERS[i])."""
        users: list[list[int]] = [[] for _ in self.nodes]
        for dst, deps in enumerate(self.predecessors):
            for src in deps:
                users[src].append(dst)
        return tuple(tuple(u) for u in users)

    def to_json(self) -> str:
        """Serialise in the interchange shape `{"nodes": [...], "fixed_memory": int}`.

        A node's "workspace" and "retained" are written only when nonzero, "recompute_workspace" and
        "recompute_cost" only when set, the graph's "stage_held" and "opening_held" only when not empty and a fetched
        value's workspaces and release cost only when nonzero, so graphs without them keep the plain shape.
        """
        data: dict[str, Any] = {
            "nodes": [_node_to_dict(node) for node in self.nodes],
            "fixed_memory": self.fixed_memory,
        }
        if self.stage_held:
            data["stage_held"] = list(self.stage_held)
        if self.opening_held:
            data["opening_held"] = list(self.opening_held)
        if self.fetched:
            data["fetched"] = [
                {key: value for key, value in dataclasses.asdict(each).items() if value or key not in _FETCHED_OPTIONAL}
                for each in self.fetched
            ]
        if self.fetch_overlap:
            data["fetch_overlap"] = self.fetch_overlap
        if self.prefetch:
            data["prefetch"] = True
        if self.host_link is not None:
            data["host_link"] = dataclasses.asdict(self.host_link)
        return json.dumps(data, indent=1)

    @classmethod
    def from_json(cls, text: str) -> Graph:
        """Parse the interchange shape; raises InvalidGraph with the offending node on bad input."""
        try:
            data = json.loads(text)
        except json.JSONDecodeError as error:
            raise InvalidGraph(f"graph JSON does not parse: {error}") from None
        if not isinstance(data, dict) or not isinstance(data.get("nodes"), list):
            raise InvalidGraph('graph JSON must be an object with a "nodes" list (and optional "fixed_memory")')
        _known_keys("the graph", data, _GRAPH_KEYS)
        nodes = [_node_from_dict(index, entry) for index, entry in enumerate(data["nodes"])]
        stage_held = tuple(_whole_bytes(value) for value in data.get("stage_held", ()))
        opening_held = tuple(_whole_bytes(value) for value in data.get("opening_held", ()))
        fetched = tuple(_fetched_from_dict(index, entry) for index, entry in enumerate(data.get("fetched", ())))
        return cls(
            tuple(nodes),
            fixed_memory=_whole_bytes(data.get("fixed_memory", 0)),
            stage_held=stage_held,
            opening_held=opening_held,
            fetched=fetched,
            fetch_overlap=data.get("fetch_overlap", 0.0),
            prefetch=data.get("prefetch", False),
            host_link=_host_link_from_dict(data["host_link"]) if "host_link" in data else None,
        )


def _node_to_dict(node: Node) -> dict[str, Any]:
    entry: dict[str, Any] = {
        "name": node.name,
        "cost": node.cost,
        "memory": node.memory,
        "backward": node.backward,
        "inputs": list(node.inputs),
    }
    if node.workspace:
        entry["workspace"] = node.workspace
    if node.recompute_workspace is not None:
        entry["recompute_workspace"] = node.recompute_workspace
    if node.retained:
        entry["retained"] = node.retained
    if node.recompute_cost is not None:
        entry["recompute_cost"] = node.recompute_cost
    return entry


# Memory is counted in 64-bit integers: every size of a graph together must stay below 2^62 bytes.
MAX_TOTAL_BYTES = 2**62
_GRAPH_KEYS = (
    "nodes",
    "fixed_memory",
    "stage_held",
    "opening_held",
    "fetched",
    "fetch_overlap",
    "prefetch",
    "host_link",
)
_FETCHED_KEYS = tuple(field.name for field in dataclasses.fields(FetchedValue))
_WORKSPACES = ("fetch_workspace", "in_flight_workspace")
_FETCHED_BYTES = ("memory", *_WORKSPACES)
_FETCHED_OPTIONAL = (*_WORKSPACES, "release_cost")  # written only when nonzero
_FETCHED_REQUIRED = ("name", "memory", "readers", "fetch_cost", "last_use", "backward_start")
_HOST_LINK_KEYS = tuple(field.name for field in dataclasses.fields(HostLink))
_NODE_KEYS = (
    "name",
    "cost",
    "memory",
    "backward",
    "inputs",
    "workspace",
    "recompute_workspace",
    "retained",
    "recompute_cost",
)


def _known_keys(what: str, entry: dict[str, Any], known: tuple[str, ...]) -> None:
    unknown = sorted(set(entry) - set(known))
    if unknown:
        raise InvalidGraph(f"{what} has the unknown key(s) {unknown}; the keys it takes: {', '.join(known)}")


def _whole_bytes(value: Any) -> Any:
    """JSON writers may turn integers into floats such as 1024.0; take those back as integers."""
    return int(value) if isinstance(value, float) and value.is_integer() else value


def _node_from_dict(index: int, entry: Any) -> Node:
    if not isinstance(entry, dict):
        raise InvalidGraph(f"node {index} must be a JSON object, got {type(entry).__name__}")
    missing = {"name", "cost", "memory"} - entry.keys()
    if missing:
        raise InvalidGraph(f"node {index} lacks the field(s) {sorted(missing)}")
    _known_keys(f"node {index} ({entry['name']!r})", entry, _NODE_KEYS)
    if not isinstance(entry["name"], str):
        raise InvalidGraph(f"node {index}: name must be a string, got {entry['name']!r}")
    backward = entry.get("backward", False)
    if not isinstance(backward, bool):
        raise InvalidGraph(f"node {index} ({entry['name']!r}): backward must be true or false, got {backward!r}")
    inputs = entry.get("inputs", [])
    if not isinstance(inputs, list) or not all(isinstance(i, int) and not isinstance(i, bool) for i in inputs):
        raise InvalidGraph(f"node {index} ({entry['name']!r}): inputs must be a list of node indices")
    return Node(
        name=entry["name"],
        cost=entry["cost"],
        memory=_whole_bytes(entry["memory"]),
        backward=backward,
        inputs=tuple(inputs),
        workspace=_whole_bytes(entry.get("workspace", 0)),
        recompute_workspace=_whole_bytes(entry.get("recompute_workspace")),
        retained=_whole_bytes(entry.get("retained", 0)),
        recompute_cost=entry.get("recompute_cost"),
    )


def _fetched_from_dict(index: int, entry: Any) -> FetchedValue:
    if not isinstance(entry, dict):
        raise InvalidGraph(f"fetched value {index} must be a JSON object, got {type(entry).__name__}")
    _known_keys(f"fetched value {index}", entry, _FETCHED_KEYS)
    missing = set(_FETCHED_REQUIRED) - entry.keys()
    if missing:
        raise InvalidGraph(f"fetched value {index} lacks the field(s) {sorted(missing)}")
    sizes = {field: _whole_bytes(entry[field]) for field in _FETCHED_BYTES if field in entry}
    return FetchedValue(**{**entry, **sizes, "readers": tuple(entry["readers"])})


def _host_link_from_dict(entry: Any) -> HostLink:
    if not isinstance(entry, dict):
        raise InvalidGraph(f"host_link must be a JSON object, got {type(entry).__name__}")
    _known_keys("host_link", entry, _HOST_LINK_KEYS)
    try:
        return HostLink(**entry)
    except (TypeError, ValueError) as error:
        raise InvalidGraph(f"host_link: {error}") from None


def _validate_fetched(graph: Graph) -> None:
    T = len(graph.nodes)
    overlap = graph.fetch_overlap
    if isinstance(overlap, bool) or not isinstance(overlap, (int, float)) or not 0 <= overlap <= 1:
        raise InvalidGraph(f"fetch_overlap must be a number in [0, 1], got {overlap!r}")
    if not isinstance(graph.prefetch, bool):
        raise InvalidGraph(f"prefetch must be true or false, got {graph.prefetch!r}")
    if overlap > 0 and not graph.prefetch:
        raise InvalidGraph(
            "fetch_overlap > 0 needs prefetch: only a fetch started in the stage before runs beside compute"
        )
    for index, value in enumerate(graph.fetched):
        label = f"fetched value {index} ({value.name!r})"
        for field in _FETCHED_BYTES:
            if not _is_byte_count(getattr(value, field)):
                raise InvalidGraph(
                    f"{label}: {field} must be an integer number of bytes >= 0, got {getattr(value, field)!r}"
                )
        for field in ("fetch_cost", "release_cost"):
            cost = getattr(value, field)
            if isinstance(cost, bool) or not isinstance(cost, (int, float)) or not math.isfinite(cost) or cost < 0:
                raise InvalidGraph(f"{label}: {field} must be a finite number >= 0, got {cost!r}")
        if not 0 <= value.last_use < T or not 0 <= value.backward_start <= T:
            raise InvalidGraph(f"{label}: last_use must be a stage and backward_start a stage or {T}")
        if not all(isinstance(reader, int) and 0 <= reader <= value.last_use for reader in value.readers):
            raise InvalidGraph(f"{label}: readers must be nodes at or before its last use ({value.last_use})")


def _validate(graph: Graph) -> None:
    if not _is_byte_count(graph.fixed_memory):
        raise InvalidGraph(f"fixed_memory must be an integer number of bytes >= 0, got {graph.fixed_memory!r}")

    if not graph.nodes:
        raise InvalidGraph("the graph has no nodes: a training step needs at least one op")
    for name in ("stage_held", "opening_held"):
        held = getattr(graph, name)
        if held and (len(held) != len(graph.nodes) or not all(_is_byte_count(value) for value in held)):
            raise InvalidGraph(f"{name} must be empty or one byte count >= 0 per node ({len(graph.nodes)})")
    seen: set[str] = set()
    for index, node in enumerate(graph.nodes):
        label = f"node {index} ({node.name!r})"
        if node.name in seen:
            raise InvalidGraph(f"{label}: the name is used twice; names must be unique")
        seen.add(node.name)
        for field in ("cost", "recompute_cost"):
            cost = getattr(node, field)
            if cost is None and field == "recompute_cost":
                continue
            if isinstance(cost, bool) or not isinstance(cost, (int, float)) or not math.isfinite(cost) or cost < 0:
                raise InvalidGraph(f"{label}: {field} must be a finite number >= 0, got {cost!r}")
        for field in ("memory", "workspace", "recompute_workspace", "retained"):
            value = getattr(node, field)
            if value is None and field == "recompute_workspace":
                continue
            if not _is_byte_count(value):
                raise InvalidGraph(f"{label}: {field} must be an integer number of bytes >= 0, got {value!r}")
        for source in node.inputs:
            if source == index:
                raise InvalidGraph(f"{label} reads itself: the graph has a cycle")
            if source > index:
                raise InvalidGraph(
                    f"{label} reads node {source}, which comes later: list nodes in execution (topological) order"
                )
            if source < 0:
                raise InvalidGraph(f"{label} reads node {source}: input indices must be >= 0")
    _validate_fetched(graph)
    total = (
        graph.fixed_memory
        + max(graph.stage_held, default=0)
        + max(graph.opening_held, default=0)
        + sum(map(fetch_bytes, graph.fetched))
    )
    total += sum(node.memory + node.workspace + (node.recompute_workspace or 0) + node.retained for node in graph.nodes)
    if total > MAX_TOTAL_BYTES:
        raise InvalidGraph(
            f"the graph's sizes add up to {total} bytes, over the {MAX_TOTAL_BYTES} (2^62) that its accounting "
            "takes: give sizes in bytes"
        )


def _is_byte_count(value: Any) -> bool:
    """An integer >= 0 (numpy integers too), not a bool: `True` is an int to Python, not a number of bytes."""
    return bool(not isinstance(value, (bool, np.bool_)) and isinstance(value, (int, np.integer)) and value >= 0)
