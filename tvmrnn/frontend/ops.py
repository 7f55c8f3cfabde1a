"""Converters for non-recurrent ops where TVM's Relax ONNX frontend falls short (its style: one class per op,
opset versions as `_impl_vN`); frontend.prepare folds what folding can fix before these run."""

from __future__ import annotations

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


OP_CONVERTERS = {"Squeeze": Squeeze}
