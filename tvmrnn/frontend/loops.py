"""Recurrent `Loop`/`Scan` nodes (tf2onnx's Keras GRU, SimpleRNN and some LSTMs) rewritten as ONNX LSTM/GRU/RNN nodes.

ONNX -> ONNX, before the Relax import. A loop is replaced where its body is one cell step: x_t read at the loop's step
(a Gather of a tensor of the outer graph at a counter from 0, or a Scan input), one or two float states carried, the
new h scanned out, and everything else constant. The weights are found in the body's dataflow (the MatMul reading x_t
takes W, those reading h or r*h take R, constants added to them are biases; Keras lays them out as kernel [I, G*H],
recurrent kernel [H, G*H], bias [G*H] or [2, G*H]) and re-laid out in ONNX's gate order. Then one step of the body,
evaluated with onnx.reference on random x and states, must match one step of the ONNX cell with those weights:
whatever the pattern matching assumed, a loop is only replaced by a node that computes the same thing.

Also here, the other forms tf2onnx writes around Keras' recurrent layers: the last-step `Slice` [-1:] (or [0:1]) +
`Squeeze` on the same axis becomes a `Gather` of that index (its extent known where the axis is symbolic), a Dense on a
sequence (`Tensordot`) one MatMul, and `ReverseSequence` over the full length is marked for a flip (reverse.py).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import onnx
from onnx import helper, numpy_helper

from ..errors import UnsupportedModelError

_PASS_THROUGH = {"Identity", "Cast"}  # ops a constant's root is found through, besides slicing
_SLICING = {"Slice", "Split", "Squeeze", "Unsqueeze", "Gather"}
_SHAPE_KEEPING = {"Identity", "Cast", "ReverseSequence", "Sigmoid", "Tanh", "Relu", "Neg"}
_ACTIVATIONS = {"Sigmoid", "Tanh", "Relu", "HardSigmoid", "Elu", "LeakyRelu", "Clip", "Softsign", "Softplus"}
_STEP_TOL = 1e-4


class _NotACell(Exception):
    """Why a loop's body is not a recurrent cell step (turned into one UnsupportedModelError naming the node)."""


@dataclass
class _Step:
    """What a Loop or Scan computes, in the body's names: x_t from outer X, states carried, the new h scanned out."""
    body: onnx.GraphProto
    x_outer: str  # the time-major input [T, N, I] in the outer graph
    x_step: str  # x_t in the body
    states: list  # (body input, body output, outer initial value) per float state
    scans: list  # (body output, loop output) per scanned value
    finals: list  # (loop output of a carried value, body input it is) for the states
    passed: dict = field(default_factory=dict)  # loop output -> the outer value it passes through unchanged
    aliases: dict = field(default_factory=dict)  # body input -> the outer value it is (passed through unchanged)
    counters: list = field(default_factory=list)  # loop outputs of counters (the step count at the end)


@dataclass
class _Cell:
    op: str  # LSTM | GRU | RNN
    W: np.ndarray  # ONNX layout [1, G*H, I]
    R: np.ndarray
    B: np.ndarray
    hidden: int
    attrs: dict


class _Graph:
    """Producers and constants of a graph (and of its outer graph, for a body)."""

    def __init__(self, graph: onnx.GraphProto, outer: "_Graph | None" = None, aliases: dict | None = None):
        self.graph, self.outer = graph, outer
        self.aliases = aliases or {}  # a body's inputs passed through unchanged -> the loop's inputs they are
        self.producer = {o: n for n in graph.node for o in n.output if o}
        self.initializers = {i.name: i for i in graph.initializer}  # read as arrays where asked for
        self.consts = {}
        for n in graph.node:
            if n.op_type == "Constant" and n.attribute and n.attribute[0].name == "value":
                self.consts[n.output[0]] = numpy_helper.to_array(n.attribute[0].t)

    def const(self, name):
        if name in self.initializers and name not in self.consts:
            self.consts[name] = numpy_helper.to_array(self.initializers[name])
        if name in self.consts:
            return self.consts[name]
        if name in self.aliases:
            return self.outer.const(self.aliases[name])
        if name not in self.producer and self.outer is not None and not self._is_input(name):
            return self.outer.const(name)
        return None

    def _is_input(self, name):
        return any(i.name == name for i in self.graph.input)


def _attr(node, name, default=None):
    for a in node.attribute:
        if a.name == name:
            return helper.get_attribute_value(a)
    return default


def _name(node):
    return node.name or f"{node.op_type} -> {node.output[0]}"


# -- the loop's frame: x_t, states, scans -----------------------------------------------------------------------------

def _loop_step(node, g: _Graph) -> _Step:
    body = _attr(node, "body")
    b = _Graph(body, g)
    carried = list(zip(body.input[2:], body.output[1:], node.input[2:], node.output))
    k = len(carried)
    gathers = [n for n in body.node if n.op_type == "Gather" and n.input[0] not in b.producer
               and not b._is_input(n.input[0]) and b.const(n.input[0]) is None]
    if len(gathers) != 1:
        raise _NotACell(f"it reads {len(gathers)} tensors of the outer graph per step, not one input sequence")
    gather = gathers[0]
    if _attr(gather, "axis", 0) != 0:
        raise _NotACell("its input is not read along axis 0")
    counters = _counters(body, b, g, carried)
    if gather.input[1] not in counters and gather.input[1] != body.input[0].name:
        raise _NotACell("its input is not read at the step index (a counter from 0)")
    step = _Step(body, gather.input[0], gather.output[0], [], [], [])
    for b_in, b_out, initial, out in carried:
        if b_out.name == b_in.name:
            step.aliases[b_in.name] = initial
            if out:
                step.passed[out] = initial
        elif b_in.name in counters:
            if out:
                step.counters.append(out)
        else:
            step.states.append((b_in.name, b_out.name, initial))
            step.finals.append((out, b_in.name))
    step.scans = [(o.name, out) for o, out in zip(body.output[1 + k:], node.output[k:])]
    _check_trip_count(node, g, step)
    return step


def _counters(body, b, g, carried):
    """Carried integer values starting at 0 and growing by 1 per step."""
    found = set()
    for b_in, b_out, initial, _ in carried:
        add = b.producer.get(b_out.name)
        init = g.const(initial)
        if add is None or add.op_type != "Add" or init is None or init.size != 1 or int(init.reshape(())) != 0:
            continue
        other = [i for i in add.input if i != b_in.name]
        if len(other) == 1 and b.const(other[0]) is not None and int(np.asarray(b.const(other[0])).reshape(())) == 1:
            found.add(b_in.name)
    return found


def _check_trip_count(node, g, step):
    """The loop runs once per element of x along time: its trip count is that extent (traced through shape ops)."""
    trip = _dim_source(g, node.input[0])
    if trip is None or _canonical_dim(g, *trip) != _canonical_dim(g, step.x_outer, 0):
        raise _NotACell("its trip count is not the time extent of the sequence it reads")


def _dim_source(g: _Graph, name):
    """(tensor, axis) whose extent `name` is, through Shape/Gather/Slice/Squeeze/Cast; None where not provable."""
    node = g.producer.get(name)
    if node is None:
        return None
    if node.op_type in ("Cast", "Identity", "Squeeze", "Unsqueeze", "Reshape", "Expand"):
        return _dim_source(g, node.input[0])
    if node.op_type in ("Gather", "Slice"):
        src = g.producer.get(node.input[0])
        while src is not None and src.op_type == "Cast":
            src = g.producer.get(src.input[0])
        if src is None or src.op_type != "Shape":
            return None
        index = g.const(node.input[1])
        if index is None or index.size != 1:
            return None
        if node.op_type == "Slice":
            end = g.const(node.input[2])
            if end is None or int(end.reshape(())) != int(index.reshape(())) + 1:
                return None
        return src.input[0], int(index.reshape(())) + int(_attr(src, "start", 0))
    return None


def _canonical_dim(g: _Graph, tensor, axis):
    """The dim a tensor's axis has the extent of, through ops that keep or permute shapes."""
    while tensor in g.producer:
        node = g.producer[tensor]
        if node.op_type in _SHAPE_KEEPING:
            tensor = node.input[0]
        elif node.op_type == "Transpose":
            perm = _attr(node, "perm")
            axis, tensor = perm[axis], node.input[0]
        else:
            break
    return tensor, axis


def _scan_step(node, g: _Graph) -> _Step:
    body = _attr(node, "body")
    n_scan_in = _attr(node, "num_scan_inputs")
    n_state = len(body.input) - n_scan_in
    if n_scan_in != 1:
        raise _NotACell(f"it scans {n_scan_in} inputs, not one sequence")
    for a in ("scan_input_axes", "scan_input_directions", "scan_output_axes", "scan_output_directions"):
        if any(_attr(node, a, [0])):
            raise _NotACell(f"its {a} is not all 0")
    step = _Step(body, node.input[n_state], body.input[n_state].name, [], [], [])
    for b_in, b_out, initial, out in zip(body.input[:n_state], body.output[:n_state], node.input[:n_state], node.output):
        if b_out.name == b_in.name:
            step.aliases[b_in.name] = initial
            if out:
                step.passed[out] = initial
        else:
            step.states.append((b_in.name, b_out.name, initial))
            step.finals.append((out, b_in.name))
    step.scans = [(o.name, out) for o, out in zip(body.output[n_state:], node.output[n_state:])]
    return step


# -- the cell: weights from the body's dataflow ------------------------------------------------------------------------

def _root_const(b: _Graph, name):
    """The constant a value is sliced or cast from (the whole Keras variable), with its name; (None, None) if none."""
    while True:
        value = b.const(name)
        if value is not None:
            return name, value
        node = b.producer.get(name)
        if node is None or node.op_type not in _PASS_THROUGH | _SLICING:
            return None, None
        name = node.input[0]


def _extract_cell(step: _Step, b: _Graph) -> _Cell:
    matmuls = [n for n in step.body.node if n.op_type == "MatMul"]
    reads_x = [n.input[0] == step.x_step for n in matmuls]
    x_roots = {_root_const(b, n.input[1])[0] for n, x in zip(matmuls, reads_x) if x}
    h_roots = {_root_const(b, n.input[1])[0] for n, x in zip(matmuls, reads_x) if not x}
    if len(x_roots) != 1 or len(h_roots) != 1 or None in x_roots | h_roots:
        raise _NotACell("the MatMuls reading x_t and those reading the state do not take one constant each")
    (w_name, kernel), (r_name, recurrent) = _root_const(b, x_roots.pop()), _root_const(b, h_roots.pop())
    if kernel.ndim != 2 or recurrent.ndim != 2 or recurrent.shape[1] % recurrent.shape[0]:
        raise _NotACell(f"weights of shapes {kernel.shape} and {recurrent.shape} are not a cell's")
    hidden = recurrent.shape[0]
    gates = recurrent.shape[1] // hidden
    op = {1: "RNN", 3: "GRU", 4: "LSTM"}.get(gates)
    if op is None or kernel.shape[1] != gates * hidden:
        raise _NotACell(f"weights of shapes {kernel.shape} and {recurrent.shape} are not a cell's")
    if len(step.states) != (2 if op == "LSTM" else 1):
        raise _NotACell(f"it carries {len(step.states)} states, which a {op} cell of {gates} gates does not")
    w_bias, r_bias = _biases(step, b, {w_name, r_name}, gates * hidden)
    order = [0, 3, 1, 2] if op == "LSTM" else list(range(gates))  # Keras i,f,c,o -> ONNX i,o,f,c

    def onnx_layout(m):  # Keras [rows, G*H] in Keras gate order -> ONNX [1, G*H, rows]
        blocks = np.split(np.asarray(m, np.float32), gates, axis=-1)
        return np.concatenate([blocks[i] for i in order], axis=-1).T[None]

    bias = np.concatenate([onnx_layout(w_bias[None])[0, :, 0], onnx_layout(r_bias[None])[0, :, 0]])[None]
    attrs = {"hidden_size": hidden}
    if op == "GRU":  # reset applied to h before the recurrent MatMul (reset_after=False) reads a Mul, not h
        attrs["linear_before_reset"] = 0 if any(b.producer.get(n.input[0]) is not None
                                                and b.producer[n.input[0]].op_type == "Mul" for n in matmuls) else 1
    if op == "RNN":
        acts = [n.op_type for n in step.body.node if n.op_type in _ACTIVATIONS]
        if len(acts) != 1 or acts[0] not in ("Tanh", "Relu", "Sigmoid"):
            raise _NotACell(f"its activations {acts} are not one of Tanh, Relu, Sigmoid")
        attrs["activations"] = [acts[0]]
    return _Cell(op, onnx_layout(kernel), onnx_layout(recurrent), bias, hidden, attrs)


def _biases(step, b, weights, width):
    """(input bias, recurrent bias) [G*H] each: constants of G*H (or 2 x G*H, Keras' reset_after) columns added."""
    found = {}
    for n in step.body.node:
        if n.op_type != "Add":
            continue
        for i in n.input:
            name, value = _root_const(b, i)
            if value is not None and name not in weights and value.size in (width, 2 * width):
                found[name] = value
    if len(found) > 1:
        raise _NotACell(f"it adds {len(found)} bias constants, not one")
    if not found:
        return np.zeros(width, np.float32), np.zeros(width, np.float32)
    value = next(iter(found.values())).reshape(-1, width)
    return value[0], value[1] if len(value) == 2 else np.zeros(width, np.float32)


# -- the check: one step of the body against one step of the cell ------------------------------------------------------

def _sigmoid(v):
    return 1.0 / (1.0 + np.exp(-v))


_NUMPY_ACTS = {"Tanh": np.tanh, "Relu": lambda v: np.maximum(v, 0), "Sigmoid": _sigmoid}


def _cell_step(cell: _Cell, x, h, c):
    """One step of the ONNX cell (float64), ONNX's equations: the new (h, c)."""
    W, R, H = cell.W[0].astype(np.float64), cell.R[0].astype(np.float64), cell.hidden
    wb, rb = np.split(cell.B[0].astype(np.float64), 2)
    if cell.op == "RNN":
        return _NUMPY_ACTS[cell.attrs["activations"][0]](x @ W.T + h @ R.T + wb + rb), None
    if cell.op == "LSTM":
        i, o, f, g = np.split(x @ W.T + h @ R.T + wb + rb, 4, axis=-1)
        c_new = _sigmoid(f) * c + _sigmoid(i) * np.tanh(g)
        return _sigmoid(o) * np.tanh(c_new), c_new
    xz, xr, xh = np.split(x @ W.T + wb, 3, axis=-1)
    z = _sigmoid(xz + h @ R[:H].T + rb[:H])
    r = _sigmoid(xr + h @ R[H:2 * H].T + rb[H:2 * H])
    if cell.attrs["linear_before_reset"]:
        n = np.tanh(xh + r * (h @ R[2 * H:].T + rb[2 * H:]))
    else:
        n = np.tanh(xh + (r * h) @ R[2 * H:].T + rb[2 * H:])
    return (1 - z) * n + z * h, None


def _h_state(step, b):
    """Index of h among the states: the one a MatMul reads (directly, or through the reset gate's Mul)."""
    readers = {n.input[0] for n in step.body.node if n.op_type == "MatMul"}
    for k, (b_in, _, _) in enumerate(step.states):
        if b_in in readers:
            return k
    raise _NotACell("no MatMul reads a carried state")


def _body_step(step: _Step, b: _Graph, feeds: dict):
    """The body's new states for the given x_t and states (onnx.reference on the states' cone, cut at x_t)."""
    from onnx.reference import ReferenceEvaluator

    wanted = {o for _, o, _ in step.states}
    nodes, need = [], set(wanted)
    for n in reversed(step.body.node):
        if set(n.output) & need and step.x_step not in n.output:
            nodes.append(n)
            need |= {i for i in n.input if i}
    nodes.reverse()
    produced = {o for n in nodes for o in n.output}
    free = sorted({i for n in nodes for i in n.input if i and i not in produced} | (wanted - produced))
    inits = []
    for name in free:
        if name in feeds:
            continue
        value = b.const(name)
        if value is None:
            raise _NotACell(f"its step reads '{name}', which is neither x_t, a state nor a constant")
        inits.append(numpy_helper.from_array(value, name))
    ins = [helper.make_tensor_value_info(k, helper.np_dtype_to_tensor_dtype(v.dtype), v.shape) for k, v in feeds.items()]
    outs = [helper.make_tensor_value_info(o, onnx.TensorProto.FLOAT, None) for _, o, _ in step.states]
    graph = helper.make_graph(nodes, "step", ins, outs, inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    return ReferenceEvaluator(model).run(None, feeds)


def _verify(step: _Step, b: _Graph, cell: _Cell, width: int):
    rng = np.random.default_rng(0)
    batch = 3
    x = rng.standard_normal((batch, width)).astype(np.float32)
    states = [rng.standard_normal((batch, cell.hidden)).astype(np.float32) for _ in step.states]
    feeds = {step.x_step: x} | {b_in: s for (b_in, _, _), s in zip(step.states, states)}
    got = _body_step(step, b, feeds)
    k = _h_state(step, b)
    h, c = states[k], states[1 - k] if len(states) == 2 else None
    want_h, want_c = _cell_step(cell, x.astype(np.float64), h.astype(np.float64), None if c is None else c.astype(np.float64))
    want = [want_h, want_c] if k == 0 else [want_c, want_h]
    err = max(float(np.max(np.abs(g - w))) for g, w in zip(got, want))
    if not err <= _STEP_TOL:
        acts = sorted({n.op_type for n in step.body.node if n.op_type in _ACTIVATIONS} - {"Sigmoid", "Tanh"})
        extra = f" (it applies {', '.join(acts)}; supported are ONNX's default activations)" if acts else ""
        raise _NotACell(f"one step of its body differs from an ONNX {cell.op} cell with the weights found by "
                        f"{err:.3g}{extra}")
    return k


# -- the rewrite -------------------------------------------------------------------------------------------------------

def _through_identity(b: _Graph, name):
    while name in b.producer and b.producer[name].op_type == "Identity":
        name = b.producer[name].input[0]
    return name


def _used_names(graph: onnx.GraphProto) -> set:
    """Every name some node reads (subgraphs' reads of outer names included) or the graph outputs."""
    used = {o.name for o in graph.output}
    for n in graph.node:
        used |= set(n.input)
        for a in n.attribute:
            if a.type == onnx.AttributeProto.GRAPH:
                used |= _used_names(a.g)
    return used


def _cell_nodes(node, step: _Step, cell: _Cell, k: int, used: set):
    """The ONNX recurrent node for a loop, and the glue giving the loop's outputs their values."""
    base = (node.name or node.output[0]).replace(":", "_")
    names = {s: f"{base}/{s}" for s in ("W", "R", "B", "Y", "Y_h", "Y_c", "h0", "c0", "axis0", "axis1")}
    inits = [numpy_helper.from_array(a, names[s]) for s, a in (("W", cell.W), ("R", cell.R), ("B", cell.B))]
    inits += [numpy_helper.from_array(np.array([0], np.int64), names["axis0"]),
              numpy_helper.from_array(np.array([1], np.int64), names["axis1"])]
    initial = [step.states[k][2]] + ([step.states[1 - k][2]] if cell.op == "LSTM" else [])
    nodes = [helper.make_node("Unsqueeze", [v, names["axis0"]], [names[s]]) for v, s in zip(initial, ("h0", "c0"))]
    ins = [step.x_outer, names["W"], names["R"], names["B"], "", names["h0"]] + ([names["c0"]] if cell.op == "LSTM" else [])
    outs = [names["Y"], names["Y_h"]] + ([names["Y_c"]] if cell.op == "LSTM" else [])
    nodes.append(helper.make_node(cell.op, ins, outs, name=base, **cell.attrs))
    finals = {step.states[k][0]: names["Y_h"]} | ({step.states[1 - k][0]: names["Y_c"]} if cell.op == "LSTM" else {})
    for out, b_in in step.finals:
        if out in used:
            nodes.append(helper.make_node("Squeeze", [finals[b_in], names["axis0"]], [out]))
    for _, out in step.scans:
        if out in used:
            nodes.append(helper.make_node("Squeeze", [names["Y"], names["axis1"]], [out]))
    nodes += [helper.make_node("Identity", [v], [out]) for out, v in step.passed.items() if out in used]
    return nodes, inits


def _replace_loop(node, g: _Graph, used: set):
    step = _loop_step(node, g) if node.op_type == "Loop" else _scan_step(node, g)
    if [out for out in step.counters if out in used]:
        raise _NotACell("its step counter is read after the loop")
    b = _Graph(step.body, g, step.aliases)
    cell = _extract_cell(step, b)
    k = _h_state(step, b)
    new_h = _through_identity(b, step.states[k][1])
    for value, out in step.scans:
        if out in used and _through_identity(b, value) != new_h:
            raise _NotACell(f"it scans out '{value}', which is not the new hidden state")
    _verify(step, b, cell, cell.W.shape[2])
    return _cell_nodes(node, step, cell, k, used)


def rewrite_recurrent_loops(model: onnx.ModelProto) -> onnx.ModelProto:
    """The model with each recurrent Loop/Scan as an ONNX LSTM/GRU/RNN node, last-step slices as Gathers, Dense
    layers on sequences as MatMuls and full-length ReverseSequences marked as flips.

    Returns the model itself when it has none of these. A Loop/Scan that is not a cell step raises one
    UnsupportedModelError naming the node and why.
    """
    graph = model.graph
    g = _Graph(graph)
    if not any(n.op_type in ("Loop", "Scan") or _lengths_given(n) or _reshaped_matmul(g, n) for n in graph.node) \
            and not _last_step_squeezes(g):
        return model
    model = onnx.ModelProto.FromString(model.SerializeToString())
    graph = model.graph
    g, used = _Graph(graph), _used_names(graph)
    new_nodes = []
    for node in graph.node:
        if node.op_type in ("Loop", "Scan"):
            try:
                nodes, inits = _replace_loop(node, g, used)
            except _NotACell as why:
                raise UnsupportedModelError(f"{node.op_type} node '{_name(node)}': its body is not a recurrent cell "
                                            f"step tvmrnn recognizes: {why}") from None
            new_nodes += nodes
            graph.initializer.extend(inits)
        else:
            new_nodes.append(node)
    del graph.node[:]
    graph.node.extend(new_nodes)
    _gather_last_steps(graph)
    _dense_on_sequence(graph, _ranks(model))
    _full_length_reversals(graph)
    _drop_dead_nodes(graph)
    return model


def _ranks(model: onnx.ModelProto) -> dict:
    """Each value's rank, where ONNX shape inference finds one."""
    try:
        inferred = onnx.shape_inference.infer_shapes(model).graph
    except Exception:  # noqa: BLE001 - inference is a help here, never a requirement
        return {}
    infos = list(inferred.value_info) + list(inferred.input) + list(inferred.output)
    return {v.name: len(v.type.tensor_type.shape.dim) for v in infos if v.type.tensor_type.HasField("shape")}


def _drop_dead_nodes(graph: onnx.GraphProto):
    """Nodes and initializers nothing reads any more (a replaced loop's trip count and weights)."""
    while True:
        used = _used_names(graph)
        live = [n for n in graph.node if any(o in used for o in n.output if o)]
        if len(live) == len(graph.node):
            break
        del graph.node[:]
        graph.node.extend(live)
    inits = [i for i in graph.initializer if i.name in used]
    del graph.initializer[:]
    graph.initializer.extend(inits)


def _lengths_given(node):
    return node.op_type == "ReverseSequence" and len(node.input) > 1 and node.input[1] != ""


def _full_length_reversals(graph: onnx.GraphProto):
    """ReverseSequence whose lengths are the input's time extent (expanded over the batch): lengths left empty,
    which reverse.ReverseSequence lowers to a flip."""
    g = _Graph(graph)
    for n in graph.node:
        if n.op_type != "ReverseSequence":
            continue
        lengths = g.producer.get(n.input[1])
        if lengths is None or lengths.op_type != "Expand":
            continue
        dim = _dim_source(g, lengths.input[0])
        if dim is not None and _canonical_dim(g, *dim) == _canonical_dim(g, n.input[0], _attr(n, "time_axis", 0)):
            n.input[1] = ""


# -- last-step Slice + Squeeze -----------------------------------------------------------------------------------------

_INT_MAX = 2**31 - 1


def _single_step_index(g: _Graph, node):
    """The index k where `node` is a Slice of one element [k:k+1] (or [-1:]) along one axis: (axis, k); else None."""
    if node is None or node.op_type != "Slice" or len(node.input) < 4:
        return None
    starts, ends, axes = (g.const(i) for i in node.input[1:4])
    steps = g.const(node.input[4]) if len(node.input) > 4 and node.input[4] else np.ones(1)
    if any(v is None or v.size != 1 for v in (starts, ends, axes, steps)) or int(steps.reshape(())) != 1:
        return None
    start, end = int(starts.reshape(())), int(ends.reshape(()))
    if (start == -1 and end >= _INT_MAX) or (start >= 0 and end == start + 1):
        return int(axes.reshape(())), start
    return None


def _squeeze_axes(g: _Graph, node):
    if len(node.input) > 1 and node.input[1]:
        axes = g.const(node.input[1])
        return None if axes is None else [int(a) for a in axes.reshape(-1)]
    return _attr(node, "axes")


def _last_step_squeezes(g: _Graph):
    found = {}
    for n in g.graph.node:
        if n.op_type == "Squeeze":
            sliced = _single_step_index(g, g.producer.get(n.input[0]))
            if sliced is not None and _squeeze_axes(g, n) == [sliced[0]]:
                found[n.output[0]] = (g.producer[n.input[0]].input[0], sliced)
    return found


def _gather_last_steps(graph: onnx.GraphProto):
    """Squeeze(Slice(x, [k:k+1] on axis a), a) -> Gather(x, k, axis=a): one step taken, its extent known."""
    found = _last_step_squeezes(_Graph(graph))
    out = []
    for n in graph.node:
        if n.op_type == "Squeeze" and n.output[0] in found:
            source, (axis, index) = found[n.output[0]]
            k = f"{n.output[0]}/index"
            out.append(helper.make_node("Constant", [], [k], value=numpy_helper.from_array(np.array(index, np.int64))))
            out.append(helper.make_node("Gather", [source, k], [n.output[0]], name=n.name, axis=axis))
        else:
            out.append(n)
    del graph.node[:]
    graph.node.extend(out)


# -- Keras' Dense on a sequence: tf2onnx's Tensordot -------------------------------------------------------------------

class _ShapeOf:
    """Shape(t), its rank not needed until indexed."""

    def __init__(self, tensor):
        self.tensor = tensor


def _int_vector(g: _Graph, name):
    """A 1-D int value as a list of ints and dims ((tensor, axis), canonical), through the shape ops tf2onnx writes;
    None where it is anything else."""
    value = g.const(name)
    if value is not None:
        return [int(v) for v in value.reshape(-1)] if value.dtype.kind in "iu" and value.ndim <= 1 else None
    node = g.producer.get(name)
    if node is None:
        return None
    op = node.op_type
    if op in ("Cast", "Identity"):
        return _int_vector(g, node.input[0])
    if op == "Shape":
        return None if node.attribute else _ShapeOf(node.input[0])
    if op == "Concat":
        parts = [_int_vector(g, i) for i in node.input]
        return None if any(not isinstance(p, list) for p in parts) else [v for p in parts for v in p]
    if op == "Unsqueeze":
        return _int_vector(g, node.input[0])
    if op == "ReduceProd":  # one entry (its value is not needed, only where it stands)
        data = _int_vector(g, node.input[0])
        return [("prod", tuple(data))] if isinstance(data, list) and not _attr(node, "keepdims", 1) else None
    if op == "Gather":
        data, index = _int_vector(g, node.input[0]), g.const(node.input[1])
        if data is None or index is None or _attr(node, "axis", 0) != 0 or index.ndim > 1 or (index < 0).any():
            return None
        if isinstance(data, _ShapeOf):
            return [_canonical_dim(g, data.tensor, int(i)) for i in index.reshape(-1)]
        return [data[int(i)] for i in index.reshape(-1)] if max(index.reshape(-1), default=0) < len(data) else None
    return None


def _reshaped_matmul(g: _Graph, node):
    """(MatMul, inner Reshape, W) where node is Reshape(MatMul(Reshape(x), W const 2-D)); None otherwise."""
    if node.op_type != "Reshape":
        return None
    matmul = g.producer.get(node.input[0])
    inner = g.producer.get(matmul.input[0]) if matmul is not None and matmul.op_type == "MatMul" else None
    weight = g.const(matmul.input[1]) if inner is not None and inner.op_type == "Reshape" else None
    return (matmul, inner, weight) if weight is not None and weight.ndim == 2 else None


def _dense_on_sequence(graph: onnx.GraphProto, ranks: dict):
    """Reshape(MatMul(Reshape(x, [a, C]), W[C, K]), x.shape[:-1] + [K]) -> MatMul(x, W): Keras' Dense on a sequence
    as tf2onnx writes it (tf.tensordot), whose run-time Reshape sizes TVM's ONNX frontend cannot take. The outer
    Reshape succeeds only where a = prod(x.shape[:-1]) and x's last dim is C, so both forms agree wherever the
    model runs."""
    g = _Graph(graph)
    for n in graph.node:
        found = _reshaped_matmul(g, n)
        if found is None:
            continue
        matmul, inner, weight = found
        x, s1, s2 = inner.input[0], _int_vector(g, inner.input[1]), _int_vector(g, n.input[1])
        if not isinstance(s1, list) or len(s1) != 2 or not isinstance(s2, list) or ranks.get(x) != len(s2):
            continue
        if s2[:-1] == [_canonical_dim(g, x, i) for i in range(len(s2) - 1)] and s2[-1] == weight.shape[1]:
            del n.input[:]
            n.input.extend([x, matmul.input[1]])
            n.op_type = "MatMul"
            del n.attribute[:]
