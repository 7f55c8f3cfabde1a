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

from schedules.cells import cell_for
from schedules.layer import INPUT_NAMES

from ..errors import UnsupportedModelError
from ..lowering import emit_rnn_layer, emit_rnn_stack
from ..runtime import kernel_device
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
    # stacked layers (frontend.stacks): index of a chain's first node among the recurrent nodes -> the members above it
    chains: dict = field(default_factory=dict)
    dim_bounds: dict = field(default_factory=dict)  # symbolic dim -> the bound the module enforces (max_dims)
    # a member's results, emitted with its chain's first node: index -> (spec, outputs, plan, whether it runs in a
    # storage dtype its outputs are cast back from)
    stashed: dict = field(default_factory=dict)
    stacks: list = field(default_factory=list)  # why each chain does or does not run as a wavefront, for the log
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
    index = len(ctx.layers)  # the node's place among the recurrent nodes: the frontend converts in graph order
    if index in ctx.stashed:  # a stacked layer, already emitted with the first of its chain
        return _stashed(ctx, index)
    custom = attr.get("tvm_custom", {})
    name = custom.get("name") or f"{op_type}_{index}"
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
    copies = _copy_flags(ctx, index)
    if copies is not None:
        inputs = [_copy(bb, x) if i >= 4 and isinstance(x, relax.Var) else x for i, x in enumerate(inputs)]
    stacked = _stack(ctx, bb, spec, ctx.chains[index], inputs, convert, dtype) if index in ctx.chains else None
    if stacked is not None:
        outs, ctx.kernels[name] = stacked
    else:
        outs, ctx.kernels[name] = emit_rnn_layer(bb, spec, inputs, ctx.target, ctx.kernel, ctx.tuned(spec) if ctx.tuned else None)
    return _results(bb, spec, outs, convert, copies)


def _copy_flags(ctx, index):
    return ctx.graph_copies[index] if ctx.graph_copies and index < len(ctx.graph_copies) else None


def _results(bb, spec, outs, convert, copies):
    """The node's outputs: back to fp32 where the layer ran in a storage dtype, model outputs through copies for a graph."""
    if convert:
        outs = [bb.emit(relax.op.astype(o, "float32")) for o in outs]
    elif copies is not None and spec.dtype == "float32":  # (half-precision layers' results are cast: a kernel of their own)
        outs = [_copy(bb, o) if model_output else o for o, model_output in zip(outs, list(copies) + [False] * len(outs))]
    return relax.Tuple(outs[: max(spec.num_outputs, 1)]) if spec.num_outputs > 1 else outs[0]


def _stack(ctx, bb, spec, members, inputs, convert, model_dtype):
    """The chain starting at this node (the nodes above it: members) as one wavefront kernel, where it applies: (this
    node's outputs, its plan), the members' results stashed for their own conversion; None (the node alone) where it
    does not, ctx.stacks saying why."""
    from schedules import stack_kernel

    seq, batch = _shape(inputs[0])[:2]
    specs = [spec]
    try:
        for m in members:
            below = specs[-1]
            specs.append(member_spec(m, (seq, batch, below.num_directions * below.hidden_size), model_dtype, ctx))
    except UnsupportedModelError as err:  # the node says so itself at its own conversion
        ctx.stacks.append(f"{spec.name} -> {m.node.name or m.node.op_type}: layer by layer ({err})")
        return None
    bound = batch if isinstance(batch, int) else ctx.dim_bounds.get(batch)
    tuned = [ctx.tuned(s) if ctx.tuned else None for s in specs]
    kernel, why = stack_kernel(specs, [cell_for(s) for s in specs], ctx.target, ctx.kernel, tuned, bound, kernel_device(ctx.target))
    ctx.stacks.append(f"{' -> '.join(s.name for s in specs)}: " + (why if kernel else f"layer by layer ({why})"))
    if kernel is None:
        return None
    results, plans = emit_rnn_stack(bb, specs, inputs, [m.constants for m in members], ctx.target, kernel)
    for m, s, outs, plan in zip(members, specs[1:], results[1:], plans[1:]):
        ctx.stashed[m.index] = (s, outs, plan, convert)
    return results[0], plans[0]


def member_spec(member, x_shape, dtype, ctx):
    """The spec of a node above a chain's first, from its ONNX node (its X, of x_shape, is the Y below reshaped)."""
    from onnx.helper import get_attribute_value

    node = member.node
    attrs = normalize_attrs({a.name: get_attribute_value(a) for a in node.attribute})
    shapes = {"X": tuple(x_shape)} | {k: tuple(v.shape) for k, v in member.constants.items()}
    if member.lengths:  # the first node's, which the kernel reads for every layer
        shapes["sequence_lens"] = (x_shape[1],)
    name = node.name or f"{node.op_type}_{member.index}"
    spec = spec_from_node(node.op_type, name, attrs, shapes, len(node.output), ctx.opset, dtype)
    return spec.compiled_as(ctx.storage, ctx.precision, cuda=True)


def _stashed(ctx, index):
    spec, outs, plan, convert = ctx.stashed.pop(index)
    ctx.layers.append(spec)
    ctx.kernels[spec.name] = plan
    ctx.graph_inputs[spec.name] = {}
    return _results(relax.BlockBuilder.current(), spec, outs, convert, _copy_flags(ctx, index))


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
