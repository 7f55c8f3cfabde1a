"""ONNX ReverseSequence, which TVM's Relax ONNX frontend lacks: Relax's reverse_sequence, or a flip along time.

`loops.rewrite_recurrent_loops` leaves `sequence_lens` empty where it is provably the full time extent (tf2onnx writes
Keras' go_backwards and Bidirectional as ReverseSequence with lengths expanded from the input's shape): then the
reversal is a flip, with no lengths read at run time.
"""

from __future__ import annotations

from tvm import relax
from tvm.relax.frontend.onnx.onnx_frontend import OnnxOpConverter

from ..errors import UnsupportedModelError


class ReverseSequence(OnnxOpConverter):
    @classmethod
    def _impl_v10(cls, bb, inputs, attr, params):
        data, lengths = inputs[0], inputs[1] if len(inputs) > 1 else None
        time_axis, batch_axis = attr.get("time_axis", 0), attr.get("batch_axis", 1)
        if sorted((time_axis, batch_axis)) != [0, 1]:
            raise UnsupportedModelError(f"ReverseSequence with time_axis={time_axis}, batch_axis={batch_axis}: "
                                        "supported are the axes 0 and 1 in either order")
        if lengths is None:
            return relax.op.flip(data, time_axis)
        if str(lengths.ty.dtype) != "int64":
            lengths = bb.normalize(relax.op.astype(lengths, "int64"))
        return relax.op.reverse_sequence(data, lengths, seq_axis=time_axis, batch_axis=batch_axis)


REVERSE_CONVERTERS = {"ReverseSequence": ReverseSequence}
