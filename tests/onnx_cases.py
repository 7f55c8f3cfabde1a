"""Single-node ONNX models of LSTM/GRU/RNN for the conformance tests, with random inputs.

A `Case` is one node configuration; `case.model()` builds it (weights as initializers or as
graph inputs), `case.feeds(rng, T, N)` draws inputs, and `case.twin()` is its layout-0 twin:
ONNX Runtime refuses layout 1, so layout-1 cases are checked against the twin with
transposed inputs and outputs.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import numpy as np
import onnx
from onnx import TensorProto, helper

from reference import GATES, rnn_reference

ONNX_DTYPE = {"float32": TensorProto.FLOAT, "float16": TensorProto.FLOAT16}


@dataclass(frozen=True)
class Case:
    op: str = "LSTM"
    hidden: int = 8
    input_size: int = 5
    direction: str = "forward"
    layout: int = 0
    optional: tuple = ("B",)  # optional inputs present: B, sequence_lens, initial_h, initial_c, P
    outputs: tuple = ("Y", "Y_h", "Y_c")  # names given to the outputs; "" skips one
    activations: tuple | None = None
    activation_alpha: tuple | None = None
    activation_beta: tuple | None = None
    clip: float | None = None
    input_forget: int = 0
    linear_before_reset: int = 0
    weights_as_inputs: bool = False
    opset: int = 14
    seed: int = 0
    dtype: str = "float32"

    @property
    def D(self):
        return 2 if self.direction == "bidirectional" else 1

    @property
    def input_names(self):
        names = {"LSTM": ["X", "W", "R", "B", "sequence_lens", "initial_h", "initial_c", "P"]}.get(
            self.op, ["X", "W", "R", "B", "sequence_lens", "initial_h"])
        last = max([0, 1, 2] + [names.index(o) for o in self.optional])
        return [n if n in ("X", "W", "R") or n in self.optional else "" for n in names[:last + 1]]

    @property
    def output_names(self):
        return tuple(self.outputs[: 3 if self.op == "LSTM" else 2])

    def attrs(self) -> dict:
        a = {"hidden_size": self.hidden, "direction": self.direction}
        if self.layout:
            a["layout"] = self.layout
        for k in ("activations", "activation_alpha", "activation_beta", "clip"):
            if getattr(self, k) is not None:
                a[k] = list(getattr(self, k)) if k != "clip" else self.clip
        if self.op == "LSTM" and self.input_forget:
            a["input_forget"] = 1
        if self.op == "GRU" and self.linear_before_reset:
            a["linear_before_reset"] = 1
        return a

    def _weight_shapes(self) -> dict:
        G, H, D, I = GATES[self.op], self.hidden, self.D, self.input_size
        return {"W": (D, G * H, I), "R": (D, G * H, H), "B": (D, 2 * G * H), "P": (D, 3 * H)}

    def weights(self) -> dict:
        rng = np.random.default_rng(self.seed)
        s = 1 / np.sqrt(self.hidden)
        w = {k: rng.uniform(-s, s, shape) for k, shape in self._weight_shapes().items()}  # all four drawn, in this order
        return {k: v.astype(self.dtype) for k, v in w.items() if k in ("W", "R") or k in self.optional}

    def _shape(self, name):
        H, D, I = self.hidden, self.D, self.input_size
        seq_batch = ["seq", "batch"] if self.layout == 0 else ["batch", "seq"]
        state = ["batch", D, H] if self.layout else [D, "batch", H]
        return {"X": seq_batch + [I], "sequence_lens": ["batch"], "initial_h": state, "initial_c": state}[name]

    def model(self) -> onnx.ModelProto:
        shapes = {k: v for k, v in self._weight_shapes().items() if k in ("W", "R") or k in self.optional}
        elem = ONNX_DTYPE[self.dtype]
        inits = [] if self.weights_as_inputs else [onnx.numpy_helper.from_array(v, k) for k, v in self.weights().items()]
        graph_inputs = [n for n in self.input_names if n and (n not in shapes or self.weights_as_inputs)]
        vi = [helper.make_tensor_value_info(n, TensorProto.INT32 if n == "sequence_lens" else elem,
                                            list(shapes[n]) if n in shapes else self._shape(n)) for n in graph_inputs]
        outs = [helper.make_tensor_value_info(o, elem, None) for o in self.output_names if o]
        node = helper.make_node(self.op, self.input_names, list(self.output_names), name=f"{self.op.lower()}_node", **self.attrs())
        graph = helper.make_graph([node], "case", vi, outs, inits)
        # IR 10: what ONNX Runtime 1.30 (on the GPU machine) still reads
        return helper.make_model(graph, opset_imports=[helper.make_opsetid("", self.opset)], ir_version=10)

    def spec(self):
        """The node's RNNLayerSpec as the import reads it, from the model with its weights as graph inputs: no values
        drawn (a layer of H=4096 has 0.5 GB of them), and the spec holds shapes only."""
        from tvmrnn.frontend.inspect import find_rnn_layers

        return find_rnn_layers(dataclasses.replace(self, weights_as_inputs=True).model())[0].spec

    def feeds(self, rng, T, N) -> dict:
        H, D, I = self.hidden, self.D, self.input_size
        x = rng.standard_normal((T, N, I) if self.layout == 0 else (N, T, I))
        f = {"X": x}
        if "sequence_lens" in self.optional:
            lens = rng.integers(1, T + 1, N)
            lens[rng.integers(N)] = T  # ONNX Runtime sizes Y by the longest row
            f["sequence_lens"] = lens.astype(np.int32)
        for s in ("initial_h", "initial_c"):
            if s in self.optional:
                f[s] = rng.standard_normal((D, N, H) if self.layout == 0 else (N, D, H))
        if self.weights_as_inputs:
            f.update(self.weights())
        return {k: v.astype(self.dtype) if v.dtype.kind == "f" else v for k, v in f.items()}

    def reference(self, feeds) -> list:
        """The float64 reference's outputs for the named outputs, in the node's layout."""
        ins = {**self.weights(), **feeds}
        attrs = {k: v for k, v in self.attrs().items()}
        res = rnn_reference(self.op, **{k: ins.get(k) for k in ("X", "W", "R", "B", "sequence_lens", "initial_h", "initial_c", "P")}, **attrs)
        return {o: r for o, r in zip(self.output_names, res) if o}

    def twin(self) -> "Case":
        return dataclasses.replace(self, layout=0)


def to_layout0(feeds: dict) -> dict:
    """Layout-1 inputs as their layout-0 twin takes them."""
    out = dict(feeds)
    out["X"] = feeds["X"].transpose(1, 0, 2)
    for s in ("initial_h", "initial_c"):
        if s in feeds:
            out[s] = feeds[s].transpose(1, 0, 2)
    return out


def from_layout0(name: str, value: np.ndarray) -> np.ndarray:
    """A layout-0 output as layout 1 lays it out (Y [T,D,N,H] -> [N,T,D,H]; states [D,N,H] -> [N,D,H])."""
    return value.transpose(2, 0, 1, 3) if value.ndim == 4 else value.transpose(1, 0, 2)
