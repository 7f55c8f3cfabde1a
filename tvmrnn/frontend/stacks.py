"""Stacked recurrent layers in an ONNX graph: chains where one node's Y, reshaped as exporters glue layers, is the next
node's X. The import may then run a chain as one wavefront kernel (schedules.recurrent_wavefront).

ONNX has no multi-layer RNN op: PyTorch and our bench export a stack as one node per layer, joined by
Squeeze(axes=[1]) (Y [T, 1, N, H] -> [T, N, H]) or Transpose(perm=[0, 2, 1, 3]) + Reshape([0, 0, -1]). A node above
the first joins a chain only when everything it reads besides X is a constant (its weights, biases and peepholes as
initializers; no lengths or initial states), since the kernel takes them at import time.
"""

from __future__ import annotations

from dataclasses import dataclass

import onnx
from onnx import numpy_helper

from ..layer import INPUT_NAMES

RNN_OPS = tuple(INPUT_NAMES)


@dataclass
class StackMember:
    """A node above a chain's first: its place among the graph's recurrent nodes, the node, its constant inputs."""

    index: int
    node: onnx.NodeProto
    constants: dict  # ONNX input name (W, R, B, P) -> numpy array


def _constant_ints(model, name) -> list[int] | None:
    for init in model.graph.initializer:
        if init.name == name:
            return [int(v) for v in numpy_helper.to_array(init).reshape(-1)]
    return None


def _attr(node, name, default=None):
    for a in node.attribute:
        if a.name == name:
            return onnx.helper.get_attribute_value(a)
    return default


def glued(model, producers: dict, y: str, x: str) -> bool:
    """Whether x is y ([T, 1, N, H]) reshaped to [T, N, H] the way exporters join layers."""
    node = producers.get(x)
    if node is None:
        return False
    if node.op_type == "Squeeze" and node.input[0] == y:
        axes = list(_attr(node, "axes", [])) or (_constant_ints(model, node.input[1]) if len(node.input) > 1 else None)
        return axes in ([1], [-3])
    if node.op_type == "Reshape" and _constant_ints(model, node.input[1]) == [0, 0, -1]:
        t = producers.get(node.input[0])
        return t is not None and t.op_type == "Transpose" and t.input[0] == y and list(_attr(t, "perm", [])) == [0, 2, 1, 3]
    return False


def _constants(model, node) -> dict | None:
    """The node's inputs besides X by ONNX name, as arrays, if each present one is an initializer and none is a
    length or an initial state; else None."""
    inits = {i.name: i for i in model.graph.initializer}
    out = {}
    for name, value in zip(INPUT_NAMES[node.op_type], node.input):
        if name == "X" or not value:
            continue
        if name in ("sequence_lens", "initial_h", "initial_c") or value not in inits:
            return None
        out[name] = numpy_helper.to_array(inits[value])
    return out


def find_chains(model: onnx.ModelProto) -> dict[int, list[StackMember]]:
    """{index of a chain's first node among the graph's recurrent nodes: the nodes above it, in order}."""
    rnn = [n for n in model.graph.node if n.op_type in RNN_OPS]
    index = {id(n): i for i, n in enumerate(rnn)}
    producers = {o: n for n in model.graph.node for o in n.output if o}
    above = {}  # index of a node -> the member fed by its Y
    for node in rnn:
        x = node.input[0]
        for below in rnn:
            if below is node or not below.output or not below.output[0] or below.op_type not in RNN_OPS:
                continue
            if glued(model, producers, below.output[0], x):
                constants = _constants(model, node)
                if constants is not None:
                    above[index[id(below)]] = StackMember(index[id(node)], node, constants)
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
