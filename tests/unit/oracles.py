"""Independent oracles for the core tests, written straight from the paper's equations (not from the library code)."""

from __future__ import annotations

import dataclasses
import itertools

import numpy as np
from scipy.optimize import linprog

from checkmate.examples import random_training_graph
from checkmate.graph import Graph
from checkmate.moved import HostLink, Moves
from checkmate.solve import solve


def paper_cost_and_peak(graph: Graph, R: np.ndarray, S: np.ndarray) -> tuple[float, int]:
    """Cost (1a) and peak memory from the paper's U recurrence, eqs. (2)-(5), with FREE[t,k,k] dropped (section 4.8).

    Each R[t,i] costs node i's `cost` in its own stage (t = i) and its `recompute_cost` (None: `cost`) in a later one.

    U[t,0] counts the checkpoints S[t]; computing v_k adds R[t,k] M_k; after v_k, its inputs i are freed when
    FREE[t,i,k] = R[t,k] (1 - S[t+1,i]) prod_{j in USERS[i], j > k} (1 - R[t,j]). While v_k runs it also holds
    its workspace W_k (in stage k) or recompute workspace W'_k (later stages): the moment's usage is U[t,k] + that,
    plus what every node computed at least once so far retains (`Node.retained`, held to the end of the step), plus
    what stage t holds outside the plan (`Graph.stage_held`, a sharded step's units).
    """
    T = graph.size
    M = [int(m) for m in graph.memory]
    W = [node.workspace for node in graph.nodes]
    W_again = [node.workspace if node.recompute_workspace is None else node.recompute_workspace for node in graph.nodes]
    R = R.astype(bool).tolist()
    S = S.astype(bool).tolist()
    later_users = [[[j for j in graph.users[i] if j > k] for i in graph.predecessors[k]] for k in range(T)]
    stage_held = list(graph.stage_held) or [0] * T
    opening = list(graph.opening_held) or [0] * T
    first_run = [node.cost for node in graph.nodes]
    again = [node.cost if node.recompute_cost is None else node.recompute_cost for node in graph.nodes]
    cost = float(sum(float(first_run[i] if t == i else again[i]) for t in range(T) for i in range(T) if R[t][i]))
    peak = 0
    ever_computed: set[int] = set()
    for t in range(T):
        held_next = S[t + 1] if t + 1 < T else [False] * T
        usage = sum(M[i] for i in range(T) if S[t][i])
        retained_before = sum(graph.nodes[j].retained for j in range(t))
        peak = max(peak, usage + retained_before + stage_held[t] + opening[t])
        for k in range(T):
            if not R[t][k]:
                continue  # FREE[t, i, k] has the factor R[t, k]: nothing is freed after a node not computed
            usage += M[k]
            ever_computed.add(k)
            retained = sum(graph.nodes[j].retained for j in ever_computed)
            peak = max(peak, usage + retained + stage_held[t] + (W[k] if k == t else W_again[k]))
            for i, later in zip(graph.predecessors[k], later_users[k], strict=True):
                if not held_next[i] and not any(R[t][j] for j in later):
                    usage -= M[i]
    return cost, peak + graph.fixed_memory


def replay_peak(graph: Graph, steps: tuple) -> int:
    """Replay steps with a plain list of live copies: the peak right after each compute (with that node's
    workspace, or its recompute workspace when the step's stage is not the node's own, what every node computed
    so far retains and what the step's stage holds outside the plan), and before each stage's first compute (what
    is live, retained and held outside the plan there, with `Graph.opening_held`), plus fixed memory."""
    live: list[int] = []
    ever_computed: set[int] = set()
    peak = 0
    stage = -1
    for step in steps:
        if type(step).__name__ == "Compute" and step.stage != stage:
            stage = step.stage
            retained = sum(graph.nodes[j].retained for j in ever_computed)
            outside = retained + sum(graph.stage_held[stage : stage + 1]) + sum(graph.opening_held[stage : stage + 1])
            peak = max(peak, sum(int(graph.memory[i]) for i in live) + outside)
        if type(step).__name__ == "Compute":
            missing = [i for i in graph.predecessors[step.node] if i not in live]
            assert not missing, f"step computes {step.node} while its inputs {missing} are not live"
            live.append(step.node)
            ever_computed.add(step.node)
            node = graph.nodes[step.node]
            again = node.workspace if node.recompute_workspace is None else node.recompute_workspace
            transient = node.workspace if step.stage == step.node else again
            retained = sum(graph.nodes[j].retained for j in ever_computed)
            outside = retained + (graph.stage_held[step.stage] if graph.stage_held else 0)
            peak = max(peak, sum(int(graph.memory[i]) for i in live) + transient + outside)
        else:
            live.remove(step.node)
    assert live == [], f"values still live at the end of the schedule: {live}"
    return peak + graph.fixed_memory


def random_valid_s(graph: Graph, rng: np.random.Generator, density: float = 0.4) -> np.ndarray:
    """A random strictly lower-triangular S; (1c) is then met by deriving R from it."""
    T = graph.size
    return np.tril(rng.random((T, T)) < density, k=-1)


def with_workspace(graph: Graph, seed: int, largest: int = 6) -> Graph:
    """The same graph with a random workspace in [0, largest] bytes on about half the nodes, and on about half
    of those a different recompute workspace."""
    rng = np.random.default_rng(seed)
    workspace = rng.integers(0, largest + 1, graph.size) * (rng.random(graph.size) < 0.5)
    again = rng.integers(0, largest + 1, graph.size)
    differs = rng.random(graph.size) < 0.5
    nodes = tuple(
        dataclasses.replace(node, workspace=int(w), recompute_workspace=int(a) if d else None)
        for node, w, a, d in zip(graph.nodes, workspace, again, differs, strict=True)
    )
    return Graph(nodes, fixed_memory=graph.fixed_memory)


def with_recompute_costs(graph: Graph, seed: int) -> Graph:
    """The same graph with a recompute cost of its own on about two thirds of the nodes: zero on some (a
    recomputation fused into its reader's kernel for free), a random fraction of the cost on others, and above the
    cost on a few."""
    rng = np.random.default_rng(seed + 3000)
    kind = rng.integers(0, 6, graph.size)
    fraction = rng.integers(1, 10, graph.size) / 10
    choices = {
        2: lambda cost, f: 0.0,
        3: lambda cost, f: cost * f,
        4: lambda cost, f: cost * f,
        5: lambda cost, f: cost + 1.0 + f,
    }
    nodes = tuple(
        dataclasses.replace(node, recompute_cost=choices[k](node.cost, f) if k in choices else None)
        for node, k, f in zip(graph.nodes, kind.tolist(), fraction.tolist(), strict=True)
    )
    return dataclasses.replace(graph, nodes=nodes)


def with_retained(graph: Graph, seed: int, largest: int = 4) -> Graph:
    """The same graph with random retained bytes in [1, largest] on about half the backward nodes (gradients held
    from the node that makes them to the end of the step)."""
    rng = np.random.default_rng(seed + 1000)
    retained = rng.integers(1, largest + 1, graph.size) * (rng.random(graph.size) < 0.5) * graph.is_backward
    nodes = tuple(dataclasses.replace(node, retained=int(r)) for node, r in zip(graph.nodes, retained, strict=True))
    return Graph(nodes, fixed_memory=graph.fixed_memory)


def with_stage_held(graph: Graph, seed: int, largest: int = 4) -> Graph:
    """The same graph with random bytes in [0, largest] held outside the plan in each stage (`Graph.stage_held`: what
    a sharded step's units hold then)."""
    rng = np.random.default_rng(seed + 2000)
    return dataclasses.replace(
        graph, stage_held=tuple(int(value) for value in rng.integers(0, largest + 1, graph.size))
    )


def with_opening_held(graph: Graph, seed: int, largest: int = 30) -> Graph:
    """The same graph with random bytes in [0, largest] held outside the plan at the start of each stage
    (`Graph.opening_held`: what a sharded step's reduce-scatters between stages hold)."""
    rng = np.random.default_rng(seed + 4000)
    opening = rng.integers(0, largest + 1, graph.size)
    return dataclasses.replace(graph, opening_held=tuple(int(value) for value in opening))


def moved_everywhere_but_reads(
    graph: Graph, R: np.ndarray, S: np.ndarray, node: int, *, after_a_read: bool = False
) -> tuple[np.ndarray, Moves]:
    """S without `node`'s holds after its copy out (but in the next stage where that reads it), and the moves that
    replace them: a copy out in the stage of its first run (`after_a_read`: of a read in a later stage, where it is
    held, preferably one that other computations follow) and a copy in for each later stage that reads it."""
    T = graph.size
    S = S.copy()
    copy_out = np.zeros((T, T), dtype=bool)
    copy_in = np.zeros((T, T), dtype=bool)
    users = list(graph.users[node])
    reads = [stage for stage in range(node + 1, T) if R[stage, users].any() and S[stage, node]]
    # preferably a read followed by other computations in its stage: its copy out keeps the value to the stage's end
    busy = [stage for stage in reads if np.flatnonzero(R[stage]).max() > max(u for u in users if R[stage, u])]
    made = (busy or reads)[0] if after_a_read and reads else node
    copy_out[made, node] = True
    if made + 1 < T and not R[made + 1, users].any():
        S[made + 1, node] = False  # not read in the stage after its copy out: dropped when that ends
    for stage in range(made + 2, T):
        read = bool(R[stage, users].any())
        S[stage, node] = False
        if not read or R[stage, node]:
            continue
        if copy_in[stage - 1, node] or R[stage - 1, node] or S[stage - 1, node]:
            S[stage, node] = True  # on the device in the stage before: held into this one
        else:
            copy_in[stage, node] = True
    return S, Moves(copy_out, copy_in)


def moved_cost_and_usage(graph: Graph, R: np.ndarray, S: np.ndarray, moves: Moves) -> tuple[float, list[int], int]:
    """(cost, device usage after each computation, host peak) from the rules of `checkmate.moved` and the paper's
    equations (with each running node's workspace and what the nodes run so far retain), with plain loops: nothing
    from the library's simulator. The waits for copies are the optimum of the fluid link as a linear program
    (`least_waits`), not the simulator's earliest-deadline schedule."""
    T = graph.size
    M = [int(node.memory) for node in graph.nodes]
    link = graph.host_link
    assert link is not None
    out = moves.copy_out.astype(bool).tolist()
    back = moves.copy_in.astype(bool).tolist()
    buffer = moves.buffers(T).astype(bool).tolist()
    R_ = R.astype(bool).tolist()
    S_ = S.astype(bool).tolist()
    first = [node.cost for node in graph.nodes]
    again = [node.cost if node.recompute_cost is None else node.recompute_cost for node in graph.nodes]
    cost, usages = 0.0, []
    computes = []
    ever_computed: set[int] = set()
    for t in range(T):
        compute = sum(first[i] if i == t else again[i] for i in range(T) if R_[t][i])
        computes.append(compute)
        cost += compute
        buffers = sum(M[i] for i in range(T) if buffer[t][i])
        held_next = S_[t + 1] if t + 1 < T else [False] * T
        usage = sum(M[i] for i in range(T) if S_[t][i] or back[t][i])
        for k in range(T):
            if not R_[t][k]:
                continue
            usage += M[k]
            ever_computed.add(k)
            retained = sum(graph.nodes[j].retained for j in ever_computed)
            node = graph.nodes[k]
            rerun = node.workspace if node.recompute_workspace is None else node.recompute_workspace
            running = node.workspace if k == t else rerun
            usages.append(usage + buffers + running + retained + graph.fixed_memory)
            for i in graph.predecessors[k]:
                later = any(R_[t][j] for j in graph.users[i] if j > k)
                if not held_next[i] and not later and not out[t][i]:
                    usage -= M[i]
    jobs = []  # (direction, work, first stage, last stage)
    for i in range(T):
        for t in range(T):
            if out[t][i]:
                last = t
                while last + 2 < T and S_[last + 2][i]:
                    last += 1  # the value is held through the whole of stage last + 1
                jobs.append((0, link.latency + link.to_host_per_byte * M[i], t, last))
            if back[t][i]:
                start = t - 1
                while start - 1 >= 0 and buffer[start - 1][i]:
                    start -= 1
                jobs.append((1, link.latency + link.to_device_per_byte * M[i], start, t - 1))
    cost += least_waits(jobs, [link.overlap * compute for compute in computes])
    host = sum(M[i] for i in range(T) if any(out[t][i] for t in range(T)))
    return cost, usages, host


def least_waits(jobs: list[tuple[int, float, int, int]], lent: list[float]) -> float:
    """The least total wait of a fluid link: each job's work done within its stages, each stage lending each
    direction `lent[s]` plus the stage's wait X[s]; minimise sum X, by linear programming."""
    T = len(lent)
    cells = [(job, s) for job, (_, _, first, last) in enumerate(jobs) for s in range(first, last + 1)]
    n = len(cells) + T
    objective = np.zeros(n)
    objective[len(cells) :] = 1.0
    equal_rows, equal_bounds = [], []
    for job, (_, work, _, _) in enumerate(jobs):
        row = np.zeros(n)
        for column, (owner, _) in enumerate(cells):
            if owner == job:
                row[column] = 1.0
        equal_rows.append(row)
        equal_bounds.append(work)
    upper_rows, upper_bounds = [], []
    for direction in (0, 1):
        for s in range(T):
            row = np.zeros(n)
            for column, (job, stage) in enumerate(cells):
                if stage == s and jobs[job][0] == direction:
                    row[column] = 1.0
            row[len(cells) + s] = -1.0
            upper_rows.append(row)
            upper_bounds.append(lent[s])
    result = linprog(
        objective,
        A_ub=np.array(upper_rows),
        b_ub=np.array(upper_bounds),
        A_eq=np.array(equal_rows) if equal_rows else None,
        b_eq=np.array(equal_bounds) if equal_bounds else None,
        bounds=(0, None),
        method="highs",
    )
    assert result.status == 0, result.message
    return float(result.fun)


def random_plans_with_moves(seed: int, dearest: float) -> tuple[Graph, list[tuple[str, np.ndarray, np.ndarray, Moves]]]:
    """A random 6-node training graph with a random host link (each way at most `dearest` per byte), and plans that
    move one value each (`moved_everywhere_but_reads`) from checkpoint_all's and Chen's: (label, R, S, moves)."""
    rng = np.random.default_rng(seed)
    link = HostLink(
        float(rng.uniform(0, dearest)),
        float(rng.uniform(0, dearest)),
        float(rng.uniform(0, 1)),
        float(rng.uniform(0, 1)),
    )
    graph = dataclasses.replace(random_training_graph(6, seed=seed), host_link=link)
    plans = []
    for method, node, after_a_read in itertools.product(("checkpoint_all", "chen_sqrtn"), range(6), (False, True)):
        plan = solve(graph, None, method=method)
        if graph.nodes[node].backward or plan.R[:, node].sum() > 1:
            continue
        S, moves = moved_everywhere_but_reads(graph, plan.R, plan.S, node, after_a_read=after_a_read)
        if moves.copy_in.any():
            plans.append((f"{method}, node {node} moved{' after a read' if after_a_read else ''}", plan.R, S, moves))
    return graph, plans
