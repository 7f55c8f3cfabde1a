"""Stacked recurrent layers in an ONNX graph: chains where one node's Y, reshaped as exporters glue layers, is the next
node's X. The import may then run a chain as one wavefront kernel (schedules.recurrent_wavefront).

ONNX has no multi-layer RNN op: PyTorch and our bench export a stack as one node per layer, joined by
Squeeze(axes=[1]) (Y [T, 1, N, H] -> [T, N, H]) or Transpose(perm=[0, 2, 1, 3]) + Reshape([0, 0, -1]). A node above
the first joins a chain only when everything it reads besides X is a constant (its weights, biases and peepholes as
initializers or Constant nodes; initial states only where they are zeros, as PyTorch exports them: a slice of
ConstantOfShape), since the kernel takes them at import time, and its sequence_lens, if any, is the very tensor the
node below it reads (one set of lengths masks every layer of the kernel).
"""

from __future__ import annotations

from dataclasses import dataclass

import onnx

from schedules.layer import INPUT_NAMES

from .graph_index import GraphIndex

RNN_OPS = tuple(INPUT_NAMES)


@dataclass
class StackMember:
    """A node above a chain's first: its place among the graph's recurrent nodes, the node, its constant inputs."""

    index: int
    node: onnx.NodeProto
    constants: dict  # ONNX input name (W, R, B, P) -> numpy array
    lengths: bool = False  # it reads sequence_lens: the same tensor as the node below it


def _lengths(node) -> str:
    names = INPUT_NAMES[node.op_type]
    i = names.index("sequence_lens")
    return node.input[i] if len(node.input) > i else ""


def _constants(graph: GraphIndex, node, below) -> dict | None:
    """The node's inputs besides X by ONNX name, as arrays, if each present one is a constant, its lengths are the
    node below's (left out here: the kernel reads the first node's) and the initial states are zeros (left out: the
    kernel starts from zeros); else None."""
    if _lengths(node) != _lengths(below):
        return None
    out = {}
    for name, value in zip(INPUT_NAMES[node.op_type], node.input):
        if name in ("X", "sequence_lens") or not value:
            continue
        if name in ("initial_h", "initial_c"):
            if not graph.zeros(value):
                return None
            continue
        array = graph.constant(value)
        if array is None:
            return None
        out[name] = array
    return out


def find_chains(model: onnx.ModelProto) -> dict[int, list[StackMember]]:
    """{index of a chain's first node among the graph's recurrent nodes: the nodes above it, in order}."""
    graph = GraphIndex(model)
    rnn = [n for n in model.graph.node if n.op_type in RNN_OPS]
    index = {id(n): i for i, n in enumerate(rnn)}
    above = {}  # index of a node -> the member fed by its Y
    for node in rnn:
        y = graph.glued_from(node.input[0])
        below = graph.producers.get(y) if y else None
        if below is None or id(below) not in index or below.output[0] != y:
            continue
        constants = _constants(graph, node, below)
        if constants is not None:
            above[index[id(below)]] = StackMember(index[id(node)], node, constants, bool(_lengths(node)))
    chains, members = {}, {m.index for m in above.values()}
    for start in sorted(above):
        if start in members:
            continue  # a middle of some chain
        chain, at = [], start
        while at in above:
            chain.append(above[at])
            at = above[at].index
        chains[start] = chain
    return chains
