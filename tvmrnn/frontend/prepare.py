"""ONNX -> ONNX before the Relax import: fixed dims, constant inputs, shapes inferred and shape sub-graphs folded.

Exporters write shape arithmetic into the graph (Shape -> Gather -> Concat -> Pad/Reshape) and torch's tracer turns
`squeeze(dim)` into an `If` on the dim's extent. TVM's frontend needs such values as constants, so the graph is first
specialized (the dims and inputs the user fixes), then folded by onnxslim (ONNX shape inference plus its symbolic
shape propagation, constant folding, `If` with a constant condition inlined), repeated while the graph keeps shrinking.
Recurrent nodes' initial states that are provably zeros are then left out (`drop_zero_states`), and the nodes computing
the other states of stacked layers move before the stack (`stacks.hoist_states`: the import emits a stack at once).
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import numpy_helper

from schedules.layer import INPUT_NAMES

from ..errors import UnsupportedModelError
from .graph_index import GraphIndex, declared_dims
from .stacks import hoist_states

PREPARED = "tvmrnn.prepared"  # metadata_props key: the graph is already specialized and folded


def prepare(model: onnx.ModelProto, input_shapes: dict | None = None, consts: dict | None = None) -> onnx.ModelProto:
    """input_shapes: symbolic dim name -> extent ({"sequence": 512}), or input name -> its whole shape
    ({"input": [1, 512]}, None or a name keeps an axis symbolic). consts: input name -> value the model is specialized
    for ({"sr": 16000}); that input leaves the graph."""
    if not input_shapes and not consts and any(p.key == PREPARED for p in model.metadata_props):
        return model
    model = _copy(model)
    if input_shapes:
        fix_dims(model, input_shapes)
    if consts:
        fix_inputs(model, consts)
    forget_output_shapes(model)
    model = fold(model)
    drop_zero_states(model)
    hoist_states(model)
    model.metadata_props.add(key=PREPARED, value="1")
    return model


def _copy(model: onnx.ModelProto) -> onnx.ModelProto:
    copy = onnx.ModelProto()
    copy.CopyFrom(model)
    return copy


def _inputs(model):
    initializers = {i.name for i in model.graph.initializer}
    return [i for i in model.graph.input if i.name not in initializers]


def fix_dims(model: onnx.ModelProto, input_shapes: dict):
    inputs = {i.name: i for i in _inputs(model)}
    named = {k: v for k, v in input_shapes.items() if k not in inputs}
    dim_names = {d.dim_param for i in inputs.values() for d in i.type.tensor_type.shape.dim if d.dim_param}
    unknown = sorted(set(named) - dim_names)
    if unknown:
        raise UnsupportedModelError(f"input_shapes names {unknown}: neither an input ({sorted(inputs)}) nor a symbolic "
                                    f"dim of one ({sorted(dim_names)})")
    for name, info in inputs.items():
        dims = info.type.tensor_type.shape.dim
        if name in input_shapes:
            shape = list(input_shapes[name])
            if len(shape) != len(dims):
                raise UnsupportedModelError(f"input_shapes['{name}'] has {len(shape)} dims; input '{name}' has {len(dims)}")
            for d, extent in zip(dims, shape):
                _set_dim(d, extent, f"input_shapes['{name}']")
        for d in dims:
            if d.dim_param in named:
                _set_dim(d, named[d.dim_param], f"input_shapes['{d.dim_param}']")


def _set_dim(dim, extent, where):
    if extent is None or isinstance(extent, str):
        if isinstance(extent, str):
            dim.dim_param = extent
        return
    if int(extent) < 1:
        raise UnsupportedModelError(f"{where} = {extent}: extents are positive integers")
    if dim.HasField("dim_value") and dim.dim_value != int(extent):
        raise UnsupportedModelError(f"{where} = {extent}, but the model fixes that axis to {dim.dim_value}")
    dim.dim_value = int(extent)


def fix_inputs(model: onnx.ModelProto, consts: dict):
    inputs = {i.name: i for i in _inputs(model)}
    for name, value in consts.items():
        if name not in inputs:
            raise UnsupportedModelError(f"consts names '{name}', which is not an input of the model ({sorted(inputs)})")
        t = inputs[name].type.tensor_type
        array = np.asarray(value, dtype=onnx.helper.tensor_dtype_to_np_dtype(t.elem_type))
        rank = len(t.shape.dim)
        if array.ndim != rank:
            array = array.reshape([1] * rank) if array.size == 1 else array
        if array.ndim != rank:
            raise UnsupportedModelError(f"consts['{name}'] has shape {list(array.shape)}; input '{name}' has rank {rank}")
        model.graph.initializer.append(numpy_helper.from_array(array, name))
        model.graph.input.remove(inputs[name])


def forget_output_shapes(model: onnx.ModelProto):
    """Outputs' declared shapes are the exporter's claim, and some are wrong (ddddocr's common.onnx, from torch 1.9,
    declares [1, seqlen] for a [seqlen, 1, classes] output): shape inference, which trusts them, would fold the graph to
    fit them. Inference writes them again from the graph."""
    for output in model.graph.output:
        output.type.tensor_type.ClearField("shape")


def fold(model: onnx.ModelProto, rounds: int = 4) -> onnx.ModelProto:
    """onnxslim until the graph stops shrinking (a folded `If` exposes more constants to the next round).
    Its fusions (Conv+BatchNormalization, MatMul+Add -> Gemm, ...) write standard ops only."""
    import onnxslim

    size = _size(model)
    for _ in range(rounds):
        try:
            model = onnxslim.slim(model)
        except Exception:  # noqa: BLE001 - a graph onnxslim cannot take (an old opset): the importer names what it lacks
            return model
        fold_static_sizes(model)
        if _size(model) >= size:
            break
        size = _size(model)
    return model


def drop_zero_states(model: onnx.ModelProto):
    """Initial states of LSTM/GRU/RNN nodes that are provably zeros (a zero constant, or ConstantOfShape(0) through
    shape-only ops, as PyTorch exports a layer called without one) left out: ONNX's default is zeros, and the kernel
    then starts from zeros itself instead of reading a tensor that another kernel fills with zeros every run."""
    graph = GraphIndex(model)
    for node in model.graph.node:
        names = INPUT_NAMES.get(node.op_type, ())
        for i, (name, value) in enumerate(zip(names, node.input)):
            if name in ("initial_h", "initial_c") and value and graph.zeros(value):
                node.input[i] = ""
        while node.op_type in INPUT_NAMES and node.input and not node.input[-1]:
            node.input.pop()


def fold_static_sizes(model: onnx.ModelProto):
    """`Size` of a tensor whose shape inference fixed every extent (a `Shape` of known rank) -> a constant;
    onnxslim folds `Shape` of static tensors but not `Size`, and torch's tracer writes `Size(Shape(x))` for x.dim()."""
    graph = model.graph
    for i, node in enumerate(list(graph.node)):
        dims = _static_shape(graph, node.input[0]) if node.op_type == "Size" else None
        if dims is not None:
            value = numpy_helper.from_array(np.array(int(np.prod(dims)), dtype=np.int64))
            graph.node.remove(node)
            graph.node.insert(i, onnx.helper.make_node("Constant", [], list(node.output), name=node.name, value=value))


def _static_shape(graph, name):
    dims = declared_dims(graph, name)
    return dims if dims is not None and None not in dims else None


def _size(model):
    def count(graph):
        return sum(1 + sum(count(a.g) for a in n.attribute if a.type == onnx.AttributeProto.GRAPH) for n in graph.node)

    return count(model.graph)

