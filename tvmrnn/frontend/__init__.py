"""ONNX import: reading a model (`load_onnx`, its inputs, opset, index bounds) and, once it is planned (tvmrnn.plan),
emitting the whole graph as Relax through TVM's Relax ONNX frontend with our LSTM/GRU/RNN converters plugged in
(`to_relax`): the Relax module and the model's graph inputs/outputs (names, dtypes, shapes with symbolic dims).
"""

from __future__ import annotations

import contextlib
import io
import os
import warnings
from dataclasses import dataclass

import onnx
import tvm
from tvm import relax
from tvm.relax.frontend.onnx import onnx_frontend

from ..errors import UnsupportedModelError
from .converters import converters
from .loops import rewrite_recurrent_loops
from .unrolled import rewrite_unrolled_rnns
from .ops import OP_CONVERTERS
from .prepare import prepare
from .reverse import REVERSE_CONVERTERS


@dataclass
class TensorInfo:
    name: str
    dtype: str
    shape: list  # ints and strings (symbolic dims)

    def as_dict(self):
        return {"name": self.name, "dtype": self.dtype, "shape": list(self.shape)}


@dataclass
class RelaxModel:
    mod: tvm.IRModule
    inputs: list[TensorInfo]
    outputs: list[TensorInfo]


def load_onnx(model, input_shapes: dict | None = None, consts: dict | None = None) -> onnx.ModelProto:
    """The model as the planner and importer take it: string tensors refused, recurrent Loops and unrolled recurrences
    as recurrent nodes (loops.py, unrolled.py), then specialized and its shape computations folded (prepare.py)."""
    model = _read_onnx(model)
    refuse_strings(model)
    return prepare(rewrite_unrolled_rnns(rewrite_recurrent_loops(model)), input_shapes, consts)


def _read_onnx(model) -> onnx.ModelProto:
    if isinstance(model, onnx.ModelProto):
        return model
    if not os.path.exists(model):
        raise UnsupportedModelError(f"model file '{model}' does not exist")
    try:
        loaded = onnx.load(str(model))
    except Exception as err:  # protobuf raises its own DecodeError and friends
        raise UnsupportedModelError(f"model file '{model}' is not a readable ONNX model: {err}") from err
    if loaded.ir_version == 0 or not loaded.graph.node:  # protobuf reads an empty file as an empty model
        raise UnsupportedModelError(f"model file '{model}' is empty or not an ONNX model (no IR version, no graph nodes); "
                                    "give an exported .onnx file")
    return loaded


def refuse_strings(model: onnx.ModelProto) -> None:
    """String tensors (text ops, string inputs) have no TVM dtype: name the first one instead of failing inside TVM."""
    g = model.graph
    for v in list(g.input) + list(g.output) + list(g.value_info):
        if v.type.tensor_type.elem_type == onnx.TensorProto.STRING:
            raise UnsupportedModelError(f"tensor '{v.name}' holds strings; tvmrnn compiles numeric tensors only "
                                        "(do text processing before the model)")
    for node in g.node:
        to = next((a.i for a in node.attribute if a.name == "to"), None)
        if node.op_type == "Cast" and to == onnx.TensorProto.STRING or node.op_type.startswith("String"):
            raise UnsupportedModelError(f"{node.op_type} node '{node.name or node.output[0]}' makes strings; tvmrnn compiles "
                                        "numeric tensors only (do text processing before the model)")


def model_opset(model: onnx.ModelProto) -> int:
    for o in model.opset_import:
        if o.domain in ("", "ai.onnx"):
            return o.version
    return 1


@contextlib.contextmanager
def _our_converters(plan):
    """Plug our converters, bound to the plan, into the Relax frontend's op map, restoring it afterwards."""
    original = onnx_frontend._get_convert_map
    ours = converters(plan)

    def convert_map():
        return {**original(), **OP_CONVERTERS, **ours, **REVERSE_CONVERTERS}

    importer = onnx_frontend.ONNXGraphImporter
    convert_operator = importer._convert_operator

    def convert_naming_the_node(self, op_name, inputs, attrs, opset):
        try:
            return convert_operator(self, op_name, inputs, attrs, opset)
        except UnsupportedModelError:
            raise
        except Exception as err:  # TVM's converters raise anything from TypeError to InternalError
            name = attrs.get("tvm_custom", {}).get("name")
            node = f"node '{name}' ({op_name})" if name else f"an unnamed {op_name} node"
            raise UnsupportedModelError(f"{node}: {_reason(err)}") from err

    onnx_frontend._get_convert_map = convert_map
    importer._convert_operator = convert_naming_the_node
    try:
        yield
    finally:
        onnx_frontend._get_convert_map = original
        importer._convert_operator = convert_operator


def _reason(err: Exception) -> str:
    """An exception's message on one line (TVM's internal errors carry a C++ backtrace first)."""
    lines = [line.strip() for line in str(err).splitlines() if line.strip()]
    checks = [line for line in lines if "Check failed" in line or line.startswith(("ValueError", "TypeError"))]
    text = (checks or lines or [type(err).__name__])[-1]
    return text if text.startswith(type(err).__name__) else f"{type(err).__name__}: {text}"


_ONNX_DTYPES = {v: str(onnx.helper.tensor_dtype_to_np_dtype(v)) for v in (1, 6, 7, 9, 10, 11)}


def onnx_dtype_name(elem_type: int) -> str:
    """numpy's name for an ONNX element type (float32, int64, ...), ONNX's own lower-cased otherwise (bfloat16)."""
    return _ONNX_DTYPES.get(elem_type, onnx.TensorProto.DataType.Name(elem_type).lower())


def _value_info(v: onnx.ValueInfoProto) -> TensorInfo:
    t = v.type.tensor_type
    dims = [d.dim_value if d.HasField("dim_value") else (d.dim_param or "?") for d in t.shape.dim]
    return TensorInfo(v.name, onnx_dtype_name(t.elem_type), dims)


def index_bounds(model: onnx.ModelProto) -> dict:
    """Graph inputs used as Gather indices into a constant table (embeddings): input name -> table size.

    TVM's take reads out of bounds for a bad index (it can crash the process), so the runtime
    checks these inputs before a run.
    """
    consts = {i.name: list(i.dims) for i in model.graph.initializer}
    inputs = {i.name for i in model.graph.input} - set(consts)
    bounds = {}
    for node in model.graph.node:
        if node.op_type == "Gather" and len(node.input) == 2 and node.input[0] in consts and node.input[1] in inputs:
            axis = next((a.i for a in node.attribute if a.name == "axis"), 0)
            size = consts[node.input[0]][axis]
            bounds[node.input[1]] = min(size, bounds.get(node.input[1], size))
    return bounds


def _fill_output_shapes(outputs: list[TensorInfo], ret_ty):
    """Outputs the ONNX graph leaves unshaped get the shapes Relax inferred (symbolic dims by name)."""
    types = list(ret_ty.fields) if isinstance(ret_ty, relax.TupleType) else [ret_ty]
    for info, ty in zip(outputs, types):
        if isinstance(ty, relax.TensorType) and ty.shape is not None and (not info.shape or "?" in info.shape):
            info.shape = [int(d) if isinstance(d, tvm.tirx.IntImm) else str(d) for d in ty.shape]
            info.dtype = str(ty.dtype)


def model_inputs(model: onnx.ModelProto) -> list[TensorInfo]:
    """The graph's inputs that are not initializers: names, dtypes, shapes (symbolic dims by name)."""
    initializers = {i.name for i in model.graph.initializer}
    return [_value_info(v) for v in model.graph.input if v.name not in initializers]


def to_relax(model: onnx.ModelProto, plan) -> RelaxModel:
    """The whole graph as a Relax module, its recurrent nodes emitted as the plan (tvmrnn.plan.ModelPlan) says."""
    inputs = model_inputs(model)
    outputs = [_value_info(v) for v in model.graph.output]
    # the frontend prints each failing node's inputs to stdout; our errors already name the node
    with _our_converters(plan), warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()):
        warnings.simplefilter("ignore")  # the frontend warns about renamed inputs and unknown dims
        try:
            mod = onnx_frontend.from_onnx(model, opset=plan.opset)
        except tvm.error.OpNotImplemented as err:
            raise UnsupportedModelError(f"{err}; tvmrnn converts LSTM, GRU, RNN and what TVM's Relax ONNX frontend supports") from err
        except UnsupportedModelError:
            raise
        except NotImplementedError as err:
            raise UnsupportedModelError(f"the model uses something TVM's ONNX frontend does not support: {err}") from err
        except Exception as err:  # raised outside a converter (If branches, ShapeExpr inputs): the message names the node
            raise UnsupportedModelError(f"the import failed: {_reason(err)}") from err
    _fill_output_shapes(outputs, mod["main"].ret_ty)
    return RelaxModel(mod, inputs, outputs)
