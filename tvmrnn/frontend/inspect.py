"""Find the recurrent layers of an ONNX model without compiling it: each node's spec or why it is refused."""

from __future__ import annotations

from dataclasses import dataclass

import onnx

from schedules.layer import INPUT_NAMES, RNNLayerSpec

from ..errors import UnsupportedModelError
from . import load_onnx, model_opset, onnx_dtype_name
from .rnn_spec import UNKNOWN, normalize_attrs, spec_from_node


@dataclass
class FoundLayer:
    node: str
    op: str
    spec: RNNLayerSpec | None
    problem: str | None  # why it is not supported, or None
    x_shape: tuple = ()  # X's dims as the model declares them (ints, or names/"?" where dynamic)

    @property
    def supported(self) -> bool:
        return self.problem is None


def _known_shapes(model: onnx.ModelProto) -> dict:
    try:
        model = onnx.shape_inference.infer_shapes(model)
    except Exception:  # inference is a help, not a requirement
        pass
    g = model.graph
    shapes = {i.name: (tuple(i.dims), i.data_type) for i in g.initializer}
    for v in list(g.input) + list(g.value_info) + list(g.output):
        t = v.type.tensor_type
        if v.name in shapes or not t.HasField("shape"):
            continue
        dims = tuple(d.dim_value if d.HasField("dim_value") else (d.dim_param or "?") for d in t.shape.dim)
        shapes[v.name] = (dims, t.elem_type)
    return shapes


def find_rnn_layers(model) -> list[FoundLayer]:
    model = load_onnx(model)
    opset, shapes = model_opset(model), _known_shapes(model)
    found = []
    for i, node in enumerate(n for n in model.graph.node if n.op_type in INPUT_NAMES):
        name = node.name or f"{node.op_type}_{i}"
        attrs = normalize_attrs({a.name: onnx.helper.get_attribute_value(a) for a in node.attribute})
        present = {n: shapes.get(x, (UNKNOWN, None))[0] for n, x in zip(INPUT_NAMES[node.op_type], node.input) if x}
        dtype = onnx_dtype_name(shapes.get(node.input[0], ((), onnx.TensorProto.FLOAT))[1])
        try:
            spec = spec_from_node(node.op_type, name, attrs, present, len(node.output), opset, dtype)
            found.append(FoundLayer(name, node.op_type, spec, None, x if isinstance(x := present.get("X"), tuple) else ()))
        except UnsupportedModelError as err:
            found.append(FoundLayer(name, node.op_type, None, str(err)))
    return found
