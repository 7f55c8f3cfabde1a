"""One converter per recurrent ONNX op, in the Relax frontend's style (opset versions as `_impl_vN`).

Each emits its node as the model's plan says (tvmrnn.plan: spec, kernel, projection, stacking), through
tvmrnn.lowering; nothing is chosen here. The frontend's converter signature carries no plan, so `converters(plan)`
makes converter classes bound to one import's `Emitter`.
"""

from __future__ import annotations

from tvm import relax
from tvm.relax.frontend.onnx.onnx_frontend import OnnxOpConverter

from ..lowering import emit_rnn_layer, emit_rnn_stack

RNN_OPS = ("LSTM", "GRU", "RNN")


class Emitter:
    """The recurrent nodes of one import, emitted in graph order (the order the frontend converts them in) as the
    plan says. A wavefront stack is emitted with its first node; the nodes above it then return their stashed results."""

    def __init__(self, plan):
        self.plan = plan
        self.converted = 0
        self.stashed = {}  # index of a node above a stack's first -> its results

    def convert(self, op_type: str, bb, inputs, tensors: dict) -> relax.Expr:
        """tensors: the import's Relax expression of each ONNX tensor so far (a stack's states are read there)."""
        layer = self.plan.layers[self.converted]
        self.converted += 1
        assert layer.spec.op == op_type, (layer.spec, op_type)  # the frontend converts the nodes in graph order
        if layer.index in self.stashed:
            return self._results(bb, layer, self.stashed.pop(layer.index))
        inputs = list(inputs)
        if layer.converts:  # the layer runs in the storage dtype; the graph around it stays fp32
            inputs = [bb.emit(relax.op.astype(x, layer.spec.dtype)) if x is not None and i < 3 else x for i, x in enumerate(inputs)]
        if layer.stack is None:
            return self._results(bb, layer, emit_rnn_layer(bb, layer, inputs, self.plan.target, self.plan.device))
        chain = layer.stack
        states = [{k: tensors[v] for k, v in m.states.items()} for m in chain.members]  # computed before it (hoist_states)
        joined = tensors[chain.joined.source] if chain.joined is not None else None
        results = emit_rnn_stack(bb, chain, layer.projection, inputs, states, self.plan.target, joined)
        self.stashed.update(zip(chain.layers[1:], results[1:]))
        return self._results(bb, layer, results[0])

    @staticmethod
    def _results(bb, layer, outs: list) -> relax.Expr:
        """The node's outputs, back to fp32 where the layer ran in a storage dtype."""
        spec = layer.spec
        if layer.converts:
            outs = [bb.emit(relax.op.astype(o, "float32")) for o in outs]
        return relax.Tuple(outs[: max(spec.num_outputs, 1)]) if spec.num_outputs > 1 else outs[0]


class _RNNConverter(OnnxOpConverter):
    op_type = ""
    emitter: Emitter = None

    @classmethod
    def _impl_v1(cls, bb, inputs, attr, params):
        return cls.emitter.convert(cls.op_type, bb, inputs, params[0])

    # every opset that (re)defines these ops; rnn_spec checked what each version allows when the plan was made
    _impl_v7 = _impl_v14 = _impl_v22 = _impl_v1


def converters(plan) -> dict:
    """The frontend's converters of LSTM, GRU and RNN for one import of a planned model."""
    emitter = Emitter(plan)
    return {op: type(op, (_RNNConverter,), {"op_type": op, "emitter": emitter}) for op in RNN_OPS}
