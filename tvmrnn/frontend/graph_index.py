"""What the import-time analyses read of an ONNX graph (stacked layers, zero initial states, embedding lookups),
indexed once: each tensor's producing node and the initializers."""

from __future__ import annotations

import numpy as np
import onnx
from onnx import numpy_helper

# ops that keep an all-zero tensor all zeros whatever their other inputs
_ZERO_KEEPING = ("Slice", "Expand", "Reshape", "Unsqueeze", "Squeeze", "Identity", "Cast", "Tile", "Transpose")


def attr(node, name, default=None):
    for a in node.attribute:
        if a.name == name:
            return onnx.helper.get_attribute_value(a)
    return default


def declared_dims(graph: onnx.GraphProto, name: str) -> list[int | None] | None:
    """The dims the graph declares for tensor `name` (value_info, inputs, outputs), None for each symbolic one; None
    where no shape is declared."""
    for v in list(graph.value_info) + list(graph.input) + list(graph.output):
        if v.name == name and v.type.tensor_type.HasField("shape"):
            return [d.dim_value if d.HasField("dim_value") else None for d in v.type.tensor_type.shape.dim]
    return None


class GraphIndex:
    def __init__(self, model: onnx.ModelProto):
        self.producers = {o: n for n in model.graph.node for o in n.output if o}
        self.initializers = {i.name: i for i in model.graph.initializer}

    def constant(self, name: str):
        """The value of an initializer or a Constant node's output, as an array; None for anything computed."""
        if name in self.initializers:
            return numpy_helper.to_array(self.initializers[name])
        node = self.producers.get(name)
        if node is not None and node.op_type == "Constant":
            for a in node.attribute:
                if a.name == "value":
                    return numpy_helper.to_array(a.t)
                if a.name in ("value_ints", "value_int", "value_floats", "value_float"):
                    return np.array(onnx.helper.get_attribute_value(a))
        return None

    def constant_shape(self, name: str) -> tuple | None:
        """The shape of an initializer or a Constant node's tensor (without reading its data); None for anything computed."""
        if name in self.initializers:
            return tuple(self.initializers[name].dims)
        value = self.constant(name)
        return None if value is None else tuple(np.shape(value))

    def constant_ints(self, name: str) -> list[int] | None:
        value = self.constant(name)
        return None if value is None else [int(v) for v in np.asarray(value).reshape(-1)]

    def zeros(self, name: str, depth: int = 0) -> bool:
        """Whether a tensor is provably all zeros: a zero constant, or ConstantOfShape(0) through shape-only ops."""
        value = self.constant(name)
        if value is not None:
            return not np.asarray(value).any()
        node = self.producers.get(name)
        if node is None or depth > 8:
            return False
        if node.op_type == "ConstantOfShape":
            fill = next((numpy_helper.to_array(a.t) for a in node.attribute if a.name == "value"), None)
            return fill is None or not fill.any()
        return node.op_type in _ZERO_KEEPING and self.zeros(node.input[0], depth + 1)

    def glued_from(self, x: str) -> str | None:
        """The Y ([T, 1, N, H]) that x is, reshaped to [T, N, H] the way exporters join layers; None if it is not one."""
        node = self.producers.get(x)
        if node is None:
            return None
        if node.op_type == "Squeeze":
            axes = list(attr(node, "axes", [])) or (self.constant_ints(node.input[1]) if len(node.input) > 1 else None)
            return node.input[0] if axes in ([1], [-3]) else None
        if node.op_type == "Reshape" and self.constant_ints(node.input[1]) == [0, 0, -1]:
            t = self.producers.get(node.input[0])
            if t is not None and t.op_type == "Transpose" and list(attr(t, "perm", [])) == [0, 2, 1, 3]:
                return t.input[0]
        return None

    def table_rows(self, x: str) -> int | None:
        """The row count of the constant 2-D table x gathers its rows from (an embedding: Gather on axis 0 of a
        constant), maybe through a Transpose that keeps the last axis last; None where x is anything else."""
        node = self.producers.get(x)
        if node is not None and node.op_type == "Transpose":
            perm = list(attr(node, "perm", []))
            if not perm or perm[-1] != len(perm) - 1:
                return None
            node = self.producers.get(node.input[0])
        if node is None or node.op_type != "Gather" or attr(node, "axis", 0) != 0:
            return None
        shape = self.constant_shape(node.input[0])
        return int(shape[0]) if shape is not None and len(shape) == 2 else None
