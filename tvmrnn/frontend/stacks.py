"""Stacked recurrent layers in an ONNX graph: chains where one node's Y, reshaped as exporters glue layers, is the next
node's X. The import may then run a chain as one wavefront kernel (schedules.recurrent_wavefront).

ONNX has no multi-layer RNN op: PyTorch and our bench export a stack as one node per layer, joined by
Squeeze(axes=[1]) (Y [T, 1, N, H] -> [T, N, H]) or Transpose(perm=[0, 2, 1, 3]) + Reshape([0, 0, -1]). A node above
the first joins a chain only when its weights, biases and peepholes are constants (initializers or Constant nodes),
since the kernel takes them at import time, and its sequence_lens, if any, is the very tensor the node below it reads
(one set of lengths masks every layer of the kernel). Its initial states may be zeros (left out: the kernel starts
from zeros) or any tensor that does not depend on the chain (a streaming model's carried state, sliced per layer from
one input); `hoist_states` moves the nodes computing them before the chain's first node, which is where the import
emits the whole chain.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import onnx

from schedules.layer import INPUT_NAMES

from .graph_index import GraphIndex, attr, declared_dims

RNN_OPS = tuple(INPUT_NAMES)


@dataclass
class StackMember:
    """A node above a chain's first: its place among the graph's recurrent nodes, the node, its constant inputs."""

    index: int
    node: onnx.NodeProto
    constants: dict  # ONNX input name (W, R, B, P) -> numpy array
    lengths: bool = False  # it reads sequence_lens: the same tensor as the node below it
    states: dict = field(default_factory=dict)  # ONNX input name (initial_h, initial_c) -> tensor name, where not zeros


def _lengths(node) -> str:
    names = INPUT_NAMES[node.op_type]
    i = names.index("sequence_lens")
    return node.input[i] if len(node.input) > i else ""


def _weights(graph: GraphIndex, node) -> dict | None:
    """The node's weights, biases and peepholes by ONNX input name, as arrays, where all are constants; else None."""
    out = {}
    for name, value in zip(INPUT_NAMES[node.op_type], node.input):
        if name in ("W", "R", "B", "P") and value:
            out[name] = graph.constant(value)
            if out[name] is None:
                return None
    return out


def _states(graph: GraphIndex, node) -> dict:
    """The node's initial states that are not provably zeros (zeros are the kernel's own start), by ONNX input name."""
    return {name: value for name, value in zip(INPUT_NAMES[node.op_type], node.input)
            if name in ("initial_h", "initial_c") and value and not graph.zeros(value)}


def _member(graph: GraphIndex, index: int, node, below) -> StackMember | None:
    """The node as a member above `below`, where its weights are constants and its lengths the node below's (the
    kernel reads the first node's); else None."""
    constants = _weights(graph, node) if _lengths(node) == _lengths(below) else None
    if constants is None:
        return None
    return StackMember(index, node, constants, lengths=bool(_lengths(node)), states=_states(graph, node))


def rnn_nodes(model: onnx.ModelProto) -> list:
    """The graph's recurrent nodes in graph order (a chain's indices count among them)."""
    return [n for n in model.graph.node if n.op_type in RNN_OPS]


def head_constants(model: onnx.ModelProto, index: int) -> dict | None:
    """The weights, biases and peepholes of the index-th recurrent node by ONNX input name, as arrays, where all are
    constants (a kernel that projects the first layer's input itself takes them so); else None."""
    return _weights(GraphIndex(model), rnn_nodes(model)[index])


def find_chains(model: onnx.ModelProto) -> dict[int, list[StackMember]]:
    """{index of a chain's first node among the graph's recurrent nodes: the nodes above it, in order}."""
    graph = GraphIndex(model)
    rnn = rnn_nodes(model)
    index = {id(n): i for i, n in enumerate(rnn)}
    above = {}  # index of a node -> the member fed by its Y
    for node in rnn:
        y = graph.glued_from(node.input[0])
        below = graph.producers.get(y) if y else None
        if below is None or id(below) not in index or below.output[0] != y:
            continue
        member = _member(graph, index[id(node)], node, below)
        if member is not None:
            above[index[id(below)]] = member
    chains, members = {}, {m.index for m in above.values()}
    for start in sorted(above):
        if start in members:
            continue  # a middle of some chain
        chain, at = [], start
        while at in above and not _reads_chain(graph, above[at], [rnn[start]] + [m.node for m in chain]):
            chain.append(above[at])
            at = above[at].index
        if chain:
            chains[start] = chain
    return chains


@dataclass(frozen=True)
class JoinedStates:
    """A chain whose layers' initial h are the slices [i:i+1] of one tensor along its first axis, and whose final h
    are concatenated in layer order along it: a multi-layer RNN's carried state as torch's exporter writes it."""

    source: str  # the tensor every layer's initial h is sliced from ([layers, batch, H])
    joined: str  # the Concat output that the layers' Y_h make


def joined_states(model: onnx.ModelProto, first: int, members: list[StackMember]) -> JoinedStates | None:
    """The chain's JoinedStates, or None where its states are not carried so."""
    graph = GraphIndex(model)
    nodes = [rnn_nodes(model)[first]] + [m.node for m in members]
    named = [dict(zip(INPUT_NAMES[n.op_type], n.input)) for n in nodes]
    sliced = [_sliced_layer(graph, given.get("initial_h", "")) for given in named]
    if None in sliced or any(given.get("initial_c") for given in named):  # (an LSTM's c: not joined)
        return None
    source = sliced[0][0]
    if sliced != [(source, i) for i in range(len(nodes))] or (declared_dims(model.graph, source) or [None])[0] != len(nodes):
        return None
    finals = [n.output[1] if len(n.output) > 1 else "" for n in nodes]
    readers = [[r for r in model.graph.node if f and f in r.input] for f in finals]
    concat = readers[0][0] if readers[0] else None
    if (concat is None or concat.op_type != "Concat" or attr(concat, "axis") != 0 or list(concat.input) != finals
            or any(len(r) != 1 or r[0] is not concat for r in readers)
            or any(f in {o.name for o in model.graph.output} for f in finals)):
        return None
    return JoinedStates(source, concat.output[0])


def _sliced_layer(graph: GraphIndex, name: str) -> tuple[str, int] | None:
    """(tensor, i) where `name` is that tensor's slice [i:i+1] along its first axis (a Slice of constant bounds)."""
    node = graph.producers.get(name)
    if node is None or node.op_type != "Slice" or len(node.input) < 3:
        return None
    starts, ends = graph.constant_ints(node.input[1]), graph.constant_ints(node.input[2])
    axes = graph.constant_ints(node.input[3]) if len(node.input) > 3 and node.input[3] else [0]
    steps = graph.constant_ints(node.input[4]) if len(node.input) > 4 and node.input[4] else [1]
    if starts is None or ends != [s + 1 for s in starts] or len(starts) != 1 or axes != [0] or steps != [1]:
        return None
    return node.input[0], starts[0]


def _key(node) -> tuple:
    return tuple(node.output)  # a node's outputs name it: wrappers of one protobuf node need not be one object


def _ancestors(graph: GraphIndex, names) -> set:
    """The nodes (by _key) the tensors `names` are computed from."""
    seen, todo = set(), list(names)
    while todo:
        node = graph.producers.get(todo.pop())
        if node is not None and _key(node) not in seen:
            seen.add(_key(node))
            todo.extend(i for i in node.input if i)
    return seen


def _reads_chain(graph: GraphIndex, member: StackMember, chain_nodes: list) -> bool:
    """Whether a member's initial states are computed from a node of the chain below it (then it cannot join: the
    chain runs as one kernel)."""
    return not _ancestors(graph, member.states.values()).isdisjoint(_key(n) for n in chain_nodes)


def hoist_states(model: onnx.ModelProto) -> None:
    """The nodes computing a chain's initial states moved, in their order, before the chain's first node (in place)."""
    for start, members in find_chains(model).items():
        moving = _ancestors(GraphIndex(model), [t for m in members for t in m.states.values()])
        at = [i for i, n in enumerate(model.graph.node) if n.op_type in RNN_OPS][start]
        if not any(_key(n) in moving for n in model.graph.node[at:]):
            continue
        nodes = [onnx.NodeProto() for _ in model.graph.node]
        for copy, node in zip(nodes, model.graph.node):
            copy.CopyFrom(node)
        later = nodes[at:]
        del model.graph.node[:]
        model.graph.node.extend(nodes[:at] + [n for n in later if _key(n) in moving] + [n for n in later if _key(n) not in moving])
