"""Built-in example graphs: the paper's linear chain and random branching training graphs (skip connections)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from checkmate.graph import Graph, Node


def training_graph(
    forward_inputs: Sequence[Sequence[int]],
    *,
    costs: Sequence[float] | None = None,
    memory: Sequence[int] | None = None,
    fixed_memory: int = 0,
) -> Graph:
    """Build the joint forward + loss + backward graph of a forward DAG, as Checkmate's extraction does.

    Forward node j reads `forward_inputs[j]` (earlier forward nodes). The loss reads the last forward node.
    The gradient node of forward node j reads the gradient nodes of j's users (or the loss), j's output
    and j's inputs. Backward nodes cost twice their forward node and output as many bytes.

    Args:
        forward_inputs: for each forward node, the indices of the forward nodes it reads.
        costs: forward compute costs (default 1 each).
        memory: forward output bytes (default 1 each).
        fixed_memory: bytes always held.
    """
    n = len(forward_inputs)
    costs = [1.0] * n if costs is None else list(costs)
    memory = [1] * n if memory is None else list(memory)
    loss = n
    grad_of = {j: 2 * n - j for j in range(n)}
    users: list[list[int]] = [[] for _ in range(n)]
    for j, inputs in enumerate(forward_inputs):
        for i in inputs:
            users[i].append(j)
    nodes = [
        Node(f"forward_{j}", float(costs[j]), int(memory[j]), False, tuple(sorted(set(forward_inputs[j]))))
        for j in range(n)
    ]
    nodes.append(Node("loss", 1.0, 1, True, (n - 1,)))
    for position in range(n):
        j = n - 1 - position
        upstream = [grad_of[u] for u in users[j]] + ([loss] if j == n - 1 else [])
        inputs = sorted(set([*upstream, j, *forward_inputs[j]]))
        nodes.append(Node(f"backward_{j}", 2.0 * float(costs[j]), int(memory[j]), True, tuple(inputs)))
    return Graph(tuple(nodes), fixed_memory=fixed_memory)


def linear_graph(n: int, *, cost: float = 1.0, memory: int = 1) -> Graph:
    """The paper's linear chain (Checkmate's `gen_linear_graph`): n forward nodes, a loss, n backward nodes.

    It has 2n + 1 nodes with unit costs and sizes: the backward chain, plus an edge from each forward
    node to its gradient node.
    """
    T = 2 * n + 1
    nodes = []
    for i in range(T):
        inputs = [i - 1] if i > 0 else []
        if i > n:
            inputs.append(2 * n - i)
        kind = "forward" if i < n else ("loss" if i == n else "backward")
        nodes.append(Node(f"{kind}_{i}", cost, memory, i >= n, tuple(sorted(set(inputs)))))
    return Graph(tuple(nodes))


def random_training_graph(
    forward_nodes: int, *, seed: int = 0, skip_probability: float = 0.3, max_memory: int = 16
) -> Graph:
    """A random forward chain with skip connections (ResNet/U-Net style) and its backward graph.

    Costs are uniform in [1, 10), sizes integers in [1, max_memory]; the same seed gives the same graph.
    """
    rng = np.random.default_rng(seed)
    forward_inputs: list[list[int]] = [[]]
    for j in range(1, forward_nodes):
        inputs = {j - 1}
        if j >= 2 and rng.random() < skip_probability:
            inputs.add(int(rng.integers(0, j - 1)))
        forward_inputs.append(sorted(inputs))
    costs = rng.uniform(1.0, 10.0, forward_nodes).round(2).tolist()
    memory = rng.integers(1, max_memory + 1, forward_nodes).tolist()
    return training_graph(forward_inputs, costs=costs, memory=memory)
