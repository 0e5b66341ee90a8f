import json

import pytest

from checkmate import Graph, InvalidGraph, Node
from checkmate.examples import linear_graph, random_training_graph, training_graph


def test_linear_graph_has_2n_plus_1_nodes() -> None:
    for n in (1, 2, 5, 16):
        graph = linear_graph(n)
        assert graph.size == 2 * n + 1
        assert int(graph.is_backward.sum()) == n + 1


def test_json_round_trip_keeps_every_field() -> None:
    graph = random_training_graph(7, seed=3)
    again = Graph.from_json(graph.to_json())
    assert again == graph
    first = json.loads(graph.to_json())["nodes"][1]
    assert set(first) == {"name", "cost", "memory", "backward", "inputs"}


def test_json_round_trip_keeps_a_workspace_and_writes_it_only_when_nonzero() -> None:
    graph = Graph((Node("a", 1.0, 8, recompute_workspace=32), Node("b", 2.0, 4, inputs=(0,), workspace=16)))
    again = Graph.from_json(graph.to_json())
    assert again == graph and again.workspace.tolist() == [0, 16]
    assert again.recompute_workspace.tolist() == [32, 16]
    assert [set(entry) for entry in json.loads(graph.to_json())["nodes"]] == [
        {"name", "cost", "memory", "backward", "inputs", "recompute_workspace"},
        {"name", "cost", "memory", "backward", "inputs", "workspace"},
    ]


def test_json_round_trip_keeps_what_stages_hold_outside_the_plan() -> None:
    graph = Graph((Node("a", 1.0, 8), Node("b", 2.0, 4, inputs=(0,))), stage_held=(3, 5), opening_held=(0, 7))
    again = Graph.from_json(graph.to_json())
    assert again == graph and again.held_at_opening.tolist() == [0, 7]
    assert "opening_held" not in json.loads(Graph(graph.nodes).to_json())
    with pytest.raises(InvalidGraph, match="opening_held"):
        Graph(graph.nodes, opening_held=(1,))


def test_from_json_reads_the_documented_shape() -> None:
    text = '{"nodes": [{"name": "conv1", "cost": 1.5, "memory": 4096, "backward": false, "inputs": []},'
    text += ' {"name": "grad", "cost": 3, "memory": 8, "backward": true, "inputs": [0]}], "fixed_memory": 10}'
    graph = Graph.from_json(text)
    assert graph.size == 2 and graph.fixed_memory == 10
    assert graph.nodes[1] == Node("grad", 3, 8, True, (0,))
    assert graph.users == ((1,), ())


@pytest.mark.parametrize(
    ("nodes", "message"),
    [
        ([Node("a", 1, 1, inputs=(0,))], "cycle"),
        ([Node("a", 1, 1, inputs=(1,)), Node("b", 1, 1)], "comes later"),
        ([Node("a", 1, -4)], "memory must be"),
        ([Node("a", 1, 4, workspace=-1)], "workspace must be"),
        ([Node("a", 1, 4, workspace=2.5)], "workspace must be"),  # type: ignore[arg-type]
        ([Node("a", 1, 4, recompute_workspace=-2)], "recompute_workspace must be"),
        ([Node("a", 1, True)], "memory must be"),  # type: ignore[arg-type]
        ([Node("a", -1.0, 4)], "cost must be"),
        ([Node("a", float("nan"), 4)], "cost must be"),
        ([Node("a", 1, 1), Node("a", 1, 1)], "used twice"),
        ([Node("a", 1, 1, inputs=(-1,))], ">= 0"),
        ([], "no nodes"),
    ],
)
def test_invalid_graphs_name_the_node(nodes: list[Node], message: str) -> None:
    with pytest.raises(InvalidGraph, match=message) as caught:
        Graph(tuple(nodes))
    assert "node" in str(caught.value) or "name" in str(caught.value)


@pytest.mark.parametrize("fixed", [True, False, -1, 2.5, "10"])
def test_fixed_memory_must_be_a_byte_count(fixed: object) -> None:
    """A bool is an int to Python, but `fixed_memory=True` is a mistake, as is any non-integer."""
    with pytest.raises(InvalidGraph, match="fixed_memory must be"):
        Graph((Node("a", 1, 1),), fixed_memory=fixed)  # type: ignore[arg-type]
    with pytest.raises(InvalidGraph, match="fixed_memory must be"):
        Graph.from_json(json.dumps({"nodes": [{"name": "a", "cost": 1, "memory": 1}], "fixed_memory": fixed}))


def test_whole_floats_read_as_bytes_for_node_memory_and_fixed_memory_alike() -> None:
    """JSON writers may write 10 as 10.0; both byte fields take it back as the integer 10."""
    text = '{"nodes": [{"name": "a", "cost": 1, "memory": 4.0, "workspace": 2.0}], "fixed_memory": 10.0}'
    graph = Graph.from_json(text)
    assert graph.fixed_memory == 10 and isinstance(graph.fixed_memory, int)
    assert graph.nodes[0].memory == 4 and isinstance(graph.nodes[0].memory, int)
    assert graph.nodes[0].workspace == 2


@pytest.mark.parametrize(
    "text",
    [
        "not json",
        "[]",
        '{"nodes": [{"name": "a"}]}',
        '{"nodes": [{"name": "a", "cost": 1, "memory": 1, "inputs": "x"}]}',
    ],
)
def test_bad_json_is_a_clear_error(text: str) -> None:
    with pytest.raises(InvalidGraph):
        Graph.from_json(text)


def test_training_graph_gradient_reads_its_users_gradients() -> None:
    graph = training_graph([[], [0], [0, 1]])
    names = [node.name for node in graph.nodes]
    backward_0 = graph.nodes[names.index("backward_0")]
    assert names.index("backward_1") in backward_0.inputs
    assert names.index("backward_2") in backward_0.inputs
