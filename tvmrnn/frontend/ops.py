"""Converters for non-recurrent ops where TVM's Relax ONNX frontend falls short (its style: one class per op,
opset versions as `_impl_vN`); frontend.prepare folds what folding can fix before these run."""

from __future__ import annotations

import tvm
from tvm import relax, tirx
from tvm.relax.frontend.onnx import onnx_frontend
from tvm.relax.frontend.onnx.onnx_frontend import OnnxOpConverter

from ..errors import UnsupportedModelError


class Squeeze(OnnxOpConverter):
    """Without axes: every axis of extent 1. TVM emits R.squeeze(axis=None), which its VM cannot run; here the unit
    axes are listed where the shape is static. An axis of symbolic extent may be 1 at run time, which would change the
    output's rank, so it is refused with the fix (fixing that dim)."""

    @classmethod
    def _impl_v1(cls, bb, inputs, attr, params):
        if attr.get("axes") is not None:
            return onnx_frontend.Squeeze._impl_v1(bb, inputs, attr, params)
        return _squeeze_unit_axes(bb, inputs[0], attr)

    @classmethod
    def _impl_v13(cls, bb, inputs, attr, params):
        if len(inputs) > 1 and inputs[1] is not None:
            return onnx_frontend.Squeeze._impl_v13(bb, inputs, attr, params)
        return _squeeze_unit_axes(bb, inputs[0], attr)


def _squeeze_unit_axes(bb, x, attr):
    name = attr.get("tvm_custom", {}).get("name") or "?"
    shape = x.ty.shape if isinstance(x.ty, relax.TensorType) else None
    if shape is None:
        raise UnsupportedModelError(f"node '{name}' (Squeeze without axes): its input's rank is unknown at import")
    symbolic = [str(d) for d in shape if not isinstance(d, tirx.IntImm)]
    if symbolic:
        raise UnsupportedModelError(
            f"node '{name}' (Squeeze without axes): its input has symbolic extents {symbolic}, which squeeze away where "
            f"they are 1 at run time; fix them at compile time (--dim NAME=N, input_shapes=) or give the node axes")
    axes = [i for i, d in enumerate(shape) if int(d) == 1]
    return bb.normalize(relax.op.squeeze(x, axes)) if axes else x


_FULL = 2**31 - 1  # |start| or |end| at least this: past the axis' end, whatever its extent


class Slice(OnnxOpConverter):
    """A whole axis read backwards (step -1 from the last element past the first: how exporters reverse a sequence for
    a backward pass) becomes a flip, which keeps a symbolic extent; TVM's strided_slice loses the shape there, and the
    ops after it (a Concat with the forward pass) cannot be lowered. Other slices are TVM's."""

    @classmethod
    def _impl_v13(cls, bb, inputs, attr, params):
        consts = [_ints(onnx_frontend.get_constant(x, params)) for x in inputs[1:5]] + [None] * (5 - len(inputs))
        starts, ends, axes, steps = consts[:4]
        shape = inputs[0].ty.shape if isinstance(inputs[0].ty, relax.TensorType) else None
        if starts is None or ends is None or shape is None or (len(inputs) > 3 and inputs[3] is not None and axes is None) \
                or (len(inputs) > 4 and inputs[4] is not None and steps is None):
            return onnx_frontend.Slice._impl_v13(bb, inputs, attr, params)
        axes = [a % len(shape) for a in (axes or range(len(starts)))]
        steps = steps or [1] * len(starts)
        reversed_axes = [i for i, (b, e, s) in enumerate(zip(starts, ends, steps)) if s == -1 and _whole_axis_backwards(b, e)]
        if not reversed_axes:
            return onnx_frontend.Slice._impl_v13(bb, inputs, attr, params)
        data = inputs[0]
        for i in reversed_axes:
            data = bb.normalize(relax.op.flip(data, axes[i]))
        rest = [i for i in range(len(starts)) if i not in reversed_axes]
        if not rest:
            return data
        picked = [relax.const([v[i] for i in rest], "int64") for v in (starts, ends, axes, steps)]
        return onnx_frontend.Slice._impl_v13(bb, [data, *picked], attr, params)

    _impl_v10 = _impl_v11 = _impl_v13


def _whole_axis_backwards(start, end):
    return (start == -1 or start >= _FULL) and end <= -_FULL


class Einsum(OnnxOpConverter):
    """As Relax's einsum op, legalized by the pipeline for the target (graph_pipeline: a linear layer over a constant,
    grouped or not, becomes our packed GEMM on CPUs); TVM's converter emits TE's generic einsum at import, naive loops."""

    @classmethod
    def _impl_v12(cls, bb, inputs, attr, params):
        return bb.normalize(relax.op.einsum(list(inputs), attr["equation"].decode("utf-8")))


def _ints(x):
    return [int(v) for v in x.value.numpy().reshape(-1)] if isinstance(x, tvm.ir.GenericConst) else None


OP_CONVERTERS = {"Squeeze": Squeeze, "Slice": Slice, "Einsum": Einsum}
