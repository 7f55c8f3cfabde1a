"""One converter per recurrent ONNX op, in the Relax frontend's style (opset versions as `_impl_vN`).

Each parses its node into an `RNNLayerSpec` (all validation lives in rnn_spec) and lowers it
with `emit_rnn_layer`. The frontend's converter signature carries no opset or target, so the
importer passes them through a context variable.
"""

from __future__ import annotations

import contextvars
from dataclasses import dataclass, field

from tvm import relax
from tvm.relax.frontend.onnx.onnx_frontend import OnnxOpConverter

from ..lowering import emit_rnn_layer
from ..layer import INPUT_NAMES
from .rnn_spec import UNKNOWN, normalize_attrs, spec_from_node


@dataclass
class ImportContext:
    opset: int
    target: object
    kernel: str = "auto"  # recurrent schedule: auto | stepwise | persistent
    storage: str | None = None  # convert fp32 layers to this storage dtype (float16 | bfloat16)
    precision: str = "exact"  # math of fp32 layers (layer.PRECISIONS)
    layers: list = field(default_factory=list)
    tuned: object = None  # spec -> {batch: [KernelConfig, best first]} from the tuning logs (tvmrnn.tuning.logs)
    kernels: dict = field(default_factory=dict)  # layer name -> its recurrent kernel's plan (schedules.KernelPlan)
    graph_inputs: dict = field(default_factory=dict)  # layer name -> {ONNX input name: graph input name}
    # when the build captures a CUDA graph (tvmrnn.cuda_graph), per recurrent node in graph order: which of its outputs are
    # the model's. Those, and the states and lengths it reads straight from the model's inputs, pass through a copy, so the
    # recurrent kernel itself reads and writes buffers planned statically (TVM captures only such kernels; it allocates
    # a function's inputs and outputs per call). None: no graph
    graph_copies: list | None = None
    current = contextvars.ContextVar("tvmrnn_import")


def _shape(expr):
    ty = expr.ty
    if not isinstance(ty, relax.TensorType) or ty.shape is None:
        return UNKNOWN
    return tuple(int(d) if hasattr(d, "value") else str(d) for d in ty.shape)


def _copy(bb, x):
    """x through a copy kernel of ours (schedules.device_copy; unused ones are removed as dead code)."""
    from schedules.device_copy import device_copy  # the schedules package is ours; imported late to keep layers apart

    ty = bb.normalize(x).ty
    func = device_copy(len(ty.shape), str(ty.dtype))
    gv = bb.add_func(func, func.attrs["global_symbol"])
    return bb.emit(relax.call_tir(gv, [x], relax.TensorType(ty.shape, ty.dtype)))


def _convert(op_type, bb, inputs, attr):
    ctx = ImportContext.current.get()
    custom = attr.get("tvm_custom", {})
    name = custom.get("name") or f"{op_type}_{len(ctx.layers)}"
    inputs = list(inputs)
    dtype = str(inputs[0].ty.dtype) if inputs and inputs[0] is not None else "float32"
    shapes = {n: _shape(x) for n, x in zip(INPUT_NAMES[op_type], inputs) if x is not None}
    if len(inputs) > len(INPUT_NAMES[op_type]):
        shapes[f"input #{len(inputs) - 1}"] = UNKNOWN  # rnn_spec names the extra input in its error
    spec = spec_from_node(op_type, name, normalize_attrs(attr), shapes, custom.get("num_outputs", 1), ctx.opset, dtype)
    convert = ctx.storage is not None and spec.dtype == "float32"
    spec = spec.compiled_as(ctx.storage, ctx.precision, cuda=ctx.target.kind.name == "cuda")
    if convert:  # the layer runs in the storage dtype; the graph around it stays fp32
        inputs = [bb.emit(relax.op.astype(x, ctx.storage)) if x is not None and i < 3 else x for i, x in enumerate(inputs)]
    ctx.layers.append(spec)
    # graph inputs that feed the layer directly: the runtime checks sequence_lens values against X's length
    ctx.graph_inputs[name] = {n: x.name for n, x in zip(INPUT_NAMES[op_type], inputs)
                              if isinstance(x, relax.Var) and n in ("X", "sequence_lens")}
    copies = ctx.graph_copies[len(ctx.layers) - 1] if ctx.graph_copies and len(ctx.layers) <= len(ctx.graph_copies) else None
    if copies is not None:
        inputs = [_copy(bb, x) if i >= 4 and isinstance(x, relax.Var) else x for i, x in enumerate(inputs)]
    outs, ctx.kernels[name] = emit_rnn_layer(bb, spec, inputs, ctx.target, ctx.kernel, ctx.tuned(spec) if ctx.tuned else None)
    if convert:
        outs = [bb.emit(relax.op.astype(o, "float32")) for o in outs]
    elif copies is not None and spec.dtype == "float32":  # (half-precision layers' results are cast: a kernel of their own)
        outs = [_copy(bb, o) if model_output else o for o, model_output in zip(outs, list(copies) + [False] * len(outs))]
    return relax.Tuple(outs[: max(spec.num_outputs, 1)]) if spec.num_outputs > 1 else outs[0]


class _RNNConverter(OnnxOpConverter):
    op_type = ""

    @classmethod
    def _impl_v1(cls, bb, inputs, attr, params):
        return _convert(cls.op_type, bb, inputs, attr)

    # every opset that (re)defines these ops; rnn_spec checks what each version allows
    _impl_v7 = _impl_v14 = _impl_v22 = _impl_v1


class LSTM(_RNNConverter):
    op_type = "LSTM"


class GRU(_RNNConverter):
    op_type = "GRU"


class RNN(_RNNConverter):
    op_type = "RNN"


RNN_CONVERTERS = {"LSTM": LSTM, "GRU": GRU, "RNN": RNN}
