"""Re-layouts of constants (reshapes, transposes, casts, broadcast arithmetic) folded with numpy before TVM's
FoldConstant, which builds and runs a TIR function for every op it folds: the zoo's models each had 20-40 such ops
(a reshape per conv bias, the recurrent and dense weights' transposes), 0.9-1.4 s of CPU per compile. What this
pass leaves (strided slices, anything else) FoldConstant still folds."""

from __future__ import annotations

import numpy as np
import tvm
from tvm import relax


def _reshape(call, a):
    shape = call.args[1]
    if not isinstance(shape, relax.ShapeExpr) or not all(isinstance(v, tvm.tirx.IntImm) for v in shape.values):
        return None
    return a[0].reshape([int(v) for v in shape.values])


def _permute(call, a):
    axes = call.attrs.axes
    return np.transpose(a[0], None if axes is None else [int(v) for v in axes])


def _axes(call):
    axis = call.attrs.axis
    return None if axis is None else tuple(int(v) for v in axis)


# op -> (call, numpy operands) -> the folded array, or None where the call is not one this folds
_NUMPY = {
    "relax.reshape": _reshape,
    "relax.permute_dims": _permute,
    "relax.astype": lambda call, a: a[0].astype(str(call.attrs.dtype)),
    "relax.expand_dims": lambda call, a: np.expand_dims(a[0], _axes(call)),
    "relax.squeeze": lambda call, a: np.squeeze(a[0], _axes(call)),
    "relax.add": lambda _call, a: np.add(*a),
    "relax.subtract": lambda _call, a: np.subtract(*a),
    "relax.multiply": lambda _call, a: np.multiply(*a),
}


@relax.expr_functor.mutator
class _NumpyFolder(relax.PyExprMutator):
    def _constant(self, expr):
        if isinstance(expr, relax.Var):
            expr = self.lookup_binding(expr)
        return expr.value.numpy() if isinstance(expr, tvm.ir.expr.Constant) else None

    def visit_call_(self, op):
        call = self.visit_expr_post_order(op)
        fold = _NUMPY.get(call.op.name) if isinstance(call.op, tvm.ir.Op) else None
        tensors = [arg for arg in call.args if not isinstance(arg, relax.ShapeExpr)]
        if fold is None or not isinstance(call.ty, relax.TensorType):
            return call
        values = [self._constant(arg) for arg in tensors]
        if any(v is None for v in values):
            return call
        folded = fold(call, values)
        if folded is None or str(folded.dtype) != str(call.ty.dtype):  # numpy promoted where Relax would not
            return call
        return relax.const(np.ascontiguousarray(folded))


@tvm.transform.module_pass(opt_level=0, name="tvmrnn.FoldRelayouts")
def fold_relayouts(mod: tvm.IRModule, _ctx) -> tvm.IRModule:
    folder = _NumpyFolder(mod)
    for gv, func in mod.functions_items():
        if isinstance(func, relax.Function):
            folder.builder_.update_func(gv, folder.visit_expr(func))
    return folder.builder_.get()
