"""Unrolled recurrences as RNN nodes: PyTorch's dynamo exporter writes `nn.RNN` as one MatMul + Add + Tanh per step (the
input projection of all steps first, sliced per step), which runs as a dozen small kernels a step; the same chain is one
ONNX RNN node, which the plan gives a recurrent kernel.

A chain is recognized where every step is act(h_prev @ R + x_t [+ b]) with one constant R and activation (Tanh or Relu)
over all steps, x_t is step t of one projection P = X @ W [+ b] (Slice + Squeeze or Gather along axis 0, t = 0, 1, ...
in order) and the first h_prev is an Unsqueeze of the initial state on axis 0 ([1, N, H]). The chain's step outputs
become slices of the RNN node's Y, its last one Y_h, and a Concat of them all on axis 0 Y itself. Anything else is left
as it is.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import onnx
from onnx import helper, numpy_helper

from .graph_index import GraphIndex, attr

ACTIVATIONS = {"Tanh": "Tanh", "Relu": "Relu"}


@dataclass
class _Step:
    act: onnx.NodeProto
    h_prev: str
    R: str  # the constant h_prev is multiplied by ([H, H], R transposed)
    x: str  # the step's input term
    bias: np.ndarray  # the constant terms' sum ([H]; zeros where none)
    nodes: list = field(default_factory=list)  # the step's MatMul and Adds


@dataclass
class _Chain:
    steps: list
    X: str
    W: np.ndarray  # [I, H]
    R: np.ndarray  # [H, H]
    bias: np.ndarray  # the projection's bias plus the steps' ([H])
    h0: str


class _Graph(GraphIndex):
    def __init__(self, model):
        super().__init__(model)
        self.consumers = {}
        for n in model.graph.node:
            for i in n.input:
                self.consumers.setdefault(i, []).append(n)

    def only_use(self, name) -> bool:
        return len(self.consumers.get(name, [])) == 1


def _terms(g: _Graph, name: str, depth: int = 0) -> tuple[list, list]:
    """(the summands of an Add tree ending in `name`, its Add nodes)."""
    node = g.producers.get(name)
    if node is None or node.op_type != "Add" or depth > 3 or (depth and not g.only_use(name)):
        return [name], []
    terms, nodes = [], [node]
    for i in node.input:
        t, n = _terms(g, i, depth + 1)
        terms, nodes = terms + t, nodes + n
    return terms, nodes


def _matmul_by_constant(g: _Graph, name: str):
    """(the multiplied tensor, the constant's name, the MatMul) where `name` is MatMul(x, constant 2-D); else None."""
    node = g.producers.get(name)
    if node is None or node.op_type != "MatMul" or g.constant_shape(node.input[1]) is None or len(g.constant_shape(node.input[1])) != 2:
        return None
    return node.input[0], node.input[1], node


def _step(g: _Graph, act) -> _Step | None:
    terms, adds = _terms(g, act.input[0])
    products = [(t, m) for t in terms if (m := _matmul_by_constant(g, t)) is not None and g.only_use(t)]
    constants = [t for t in terms if g.constant(t) is not None]
    rest = [t for t in terms if t not in constants and t not in [p for p, _ in products]]
    if not adds or len(products) != 1 or len(rest) != 1:
        return None
    (_, (h_prev, R, matmul)), H = products[0], g.constant_shape(products[0][1][1])[1]
    bias = sum((np.asarray(g.constant(c), np.float64).reshape(-1) for c in constants), np.zeros(H))
    if bias.shape != (H,):
        return None
    return _Step(act, h_prev, R, rest[0], bias, adds + [matmul])


def _time_slice(g: _Graph, name: str):
    """(P, t) where `name` is step t of P along axis 0: Squeeze(Slice(P, [t], [t+1], [0]), [0]) or Gather(P, t)."""
    node = g.producers.get(name)
    if node is None:
        return None
    if node.op_type == "Gather" and attr(node, "axis", 0) == 0:
        t = g.constant_ints(node.input[1])
        return (node.input[0], t[0]) if t is not None and len(t) == 1 and g.constant(node.input[1]).ndim == 0 else None
    if node.op_type != "Squeeze" or len(node.input) < 2 or g.constant_ints(node.input[1]) != [0]:
        return None
    s = g.producers.get(node.input[0])
    if s is None or s.op_type != "Slice" or len(s.input) < 4:
        return None
    starts, ends, axes = (g.constant_ints(i) for i in s.input[1:4])
    steps = g.constant_ints(s.input[4]) if len(s.input) > 4 and s.input[4] else [1]
    if axes != [0] or steps != [1] or starts is None or ends != [starts[0] + 1]:
        return None
    return s.input[0], starts[0]


def _projection(g: _Graph, P: str):
    """(X, W [I, H], bias [H]) where P = X @ W [+ b]; else None."""
    terms, _ = _terms(g, P)
    products = [m for t in terms if (m := _matmul_by_constant(g, t)) is not None]
    constants = [t for t in terms if g.constant(t) is not None]
    if len(products) != 1 or len(terms) != 1 + len(constants):
        return None
    X, W, _ = products[0]
    W = np.asarray(g.constant(W), np.float32)
    bias = sum((np.asarray(g.constant(c), np.float64).reshape(-1) for c in constants), np.zeros(W.shape[1]))
    return (X, W, bias) if bias.shape == (W.shape[1],) else None


def _initial_state(g: _Graph, h: str) -> bool:
    node = g.producers.get(h)
    axes = (attr(node, "axes") or (g.constant_ints(node.input[1]) if len(node.input) > 1 else None)) if node is not None else None
    return node is not None and node.op_type == "Unsqueeze" and list(axes or []) == [0]


def _chains(g: _Graph, model) -> list[_Chain]:
    steps = {}
    for node in model.graph.node:
        if node.op_type in ACTIVATIONS and (s := _step(g, node)) is not None:
            steps[node.output[0]] = s
    after = {}  # h_prev -> the steps that multiply it
    for s in steps.values():
        after.setdefault(s.h_prev, []).append(s)
    chains = []
    for s in steps.values():
        if s.h_prev in steps:
            continue  # not a chain's first step
        chain = [s]
        while True:
            nxt = after.get(chain[-1].act.output[0], [])
            if len(nxt) != 1 or nxt[0].R != s.R or nxt[0].act.op_type != s.act.op_type:
                break
            chain.append(nxt[0])
        if (c := _as_chain(g, chain)) is not None:
            chains.append(c)
    return chains


def _as_chain(g: _Graph, steps: list) -> _Chain | None:
    slices = [_time_slice(g, s.x) for s in steps]
    if len(steps) < 2 or any(x is None for x in slices) or len({P for P, _ in slices}) != 1 \
            or [t for _, t in slices] != list(range(len(steps))) or not _initial_state(g, steps[0].h_prev):
        return None
    projection = _projection(g, slices[0][0])
    if projection is None or any(not np.allclose(s.bias, steps[0].bias) for s in steps):
        return None
    X, W, bias = projection
    R = np.asarray(g.constant(steps[0].R), np.float32)
    return _Chain(steps, X, W, R, bias + steps[0].bias, steps[0].h_prev)


def _rnn_nodes(chain: _Chain, prefix: str) -> tuple[list, list]:
    """The RNN node over the chain's steps of X and what stands in for its step outputs: (nodes, initializers)."""
    T, H, n = len(chain.steps), chain.R.shape[0], f"{prefix}_"
    arrays = {"W": chain.W.T[None], "R": chain.R.T[None], "B": np.concatenate([chain.bias, np.zeros(H)])[None],
              "end": np.array([T]), "axis": np.array([0]), "one": np.array([1]), **{f"t{t}": np.array([t]) for t in range(T)}}
    inits = [numpy_helper.from_array(a.astype(np.float32 if k in ("W", "R", "B") else np.int64), n + k) for k, a in arrays.items()]
    nodes = [helper.make_node("Slice", [chain.X, n + "t0", n + "end", n + "axis"], [n + "X"]),
             helper.make_node("RNN", [n + "X", n + "W", n + "R", n + "B", "", chain.h0], [n + "Y", n + "Y_h"], name=prefix,
                              hidden_size=H, activations=[ACTIVATIONS[chain.steps[0].act.op_type]]),
             helper.make_node("Squeeze", [n + "Y", n + "one"], [n + "Ys"])]
    nodes += [helper.make_node("Slice", [n + "Ys", f"{n}t{t}", f"{n}t{t + 1}", n + "axis"], [s.act.output[0]])
              for t, s in enumerate(chain.steps[:-1])]
    nodes.append(helper.make_node("Identity", [n + "Y_h"], [chain.steps[-1].act.output[0]]))
    return nodes, inits


def rewrite_unrolled_rnns(model: onnx.ModelProto) -> onnx.ModelProto:
    """The model with each unrolled recurrence (see the module's docstring) as an RNN node; the model itself where it
    has none."""
    g = _Graph(model)
    chains = _chains(g, model)
    if not chains:
        return model
    index = {id(n): k for k, n in enumerate(model.graph.node)}
    removed, inserted, inits = set(), {}, []
    for i, chain in enumerate(chains):
        prefix = f"unrolled_rnn{i}"
        nodes, chain_inits = _rnn_nodes(chain, prefix)
        inits += chain_inits
        removed |= {index[id(n)] for s in chain.steps for n in [s.act, *s.nodes]}
        outputs = [s.act.output[0] for s in chain.steps]
        for c in g.consumers.get(outputs[0], []):  # a Concat of every step on axis 0 is Y itself
            if c.op_type == "Concat" and attr(c, "axis") == 0 and list(c.input) == outputs:
                removed.add(index[id(c)])
                nodes.append(helper.make_node("Identity", [f"{prefix}_Ys"], [c.output[0]]))
        # after what the RNN node reads, before the first step (every reader of the steps comes after it)
        at = max(index[id(g.producers[x])] if x in g.producers else -1 for x in (chain.X, chain.h0))
        inserted.setdefault(at, []).extend(nodes)
    model = onnx.ModelProto.FromString(model.SerializeToString())
    nodes = list(inserted.get(-1, []))
    for k, node in enumerate(model.graph.node):
        if k not in removed:
            nodes.append(node)
        nodes += inserted.get(k, [])
    del model.graph.node[:]
    model.graph.node.extend(nodes)
    model.graph.initializer.extend(inits)
    return model
