"""tf2onnx's Keras recurrent layers (Loop bodies, ReverseSequence, last-step Slice+Squeeze) import as our cells and
match ONNX Runtime; Loops that are no cell step fail with one error naming the node. The Keras models are small files
in tests/data/keras (written by its export_cases.py), so these tests need no TensorFlow."""

from __future__ import annotations

import os

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

import tvmrnn
from tvmrnn.frontend.loops import rewrite_recurrent_loops

DATA = os.path.join(os.path.dirname(__file__), "data", "keras")
CASES = {  # file -> the recurrent ops it must import as
    "gru_reset_before_seq": ["GRU"],
    "gru_reset_after_last": ["GRU"],
    "gru_reset_before_state": ["GRU"],
    "lstm_loop_state": ["LSTM"],
    "simple_rnn_seq": ["RNN"],
    "gru_backwards": ["GRU"],
    "gru_dense_seq": ["GRU"],  # Dense on the sequence: tf2onnx's Tensordot, imported as one MatMul
    "bi_gru_lstm": ["GRU", "GRU", "LSTM"],
}


def _ort(model, feeds):
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return dict(zip([o.name for o in sess.get_outputs()], sess.run(None, feeds)))


def _assert_matches(module, model, feeds):
    ours, ref = module.run(feeds), _ort(model, feeds)
    assert set(ours) == set(ref)
    for name, want in ref.items():
        np.testing.assert_allclose(ours[name], want, rtol=1e-4, atol=1e-5, err_msg=name)


@pytest.mark.parametrize("case", list(CASES))
def test_keras_export_imports_as_cells_and_matches_onnxruntime(case):
    model = onnx.load(os.path.join(DATA, f"{case}.onnx"))
    rewritten = rewrite_recurrent_loops(model)
    ops = [n.op_type for n in rewritten.graph.node]
    assert not {"Loop", "Scan"} & set(ops)
    assert sorted(o for o in ops if o in ("LSTM", "GRU", "RNN")) == CASES[case]
    if case == "gru_reset_before_seq":
        assert helper.get_attribute_value(next(a for n in rewritten.graph.node if n.op_type == "GRU"
                                               for a in n.attribute if a.name == "linear_before_reset")) == 0
    module = tvmrnn.compile(model, target="llvm")
    rng = np.random.default_rng(len(case))
    for batch, time in ((2, 9), (1, 1)):
        _assert_matches(module, model, {"x": rng.standard_normal((batch, time, 5)).astype(np.float32)})


def test_loop_with_another_activation_names_the_node_and_why():
    with pytest.raises(tvmrnn.UnsupportedModelError) as info:
        tvmrnn.compile(os.path.join(DATA, "lstm_hard_sigmoid.onnx"), target="llvm")
    message = str(info.value)
    assert "Loop node 'functional" in message and "not a recurrent cell step" in message and "Clip" in message
    assert "\n" not in message


def _running_sum_loop():
    """A Loop that sums x over time: a Loop over a sequence, but no cell."""
    body = helper.make_graph(
        [helper.make_node("Gather", ["X", "i"], ["x_t"]), helper.make_node("Add", ["acc", "x_t"], ["acc_out"]),
         helper.make_node("Identity", ["cond"], ["cond_out"])],
        "body", [helper.make_tensor_value_info("i", TensorProto.INT64, []),
                 helper.make_tensor_value_info("cond", TensorProto.BOOL, []),
                 helper.make_tensor_value_info("acc", TensorProto.FLOAT, ["N", 4])],
        [helper.make_tensor_value_info("cond_out", TensorProto.BOOL, []),
         helper.make_tensor_value_info("acc_out", TensorProto.FLOAT, ["N", 4])])
    nodes = [helper.make_node("Shape", ["X"], ["shape"]),
             helper.make_node("Gather", ["shape", "zero"], ["T"]),
             helper.make_node("Loop", ["T", "true", "acc0"], ["total"], name="running_sum", body=body)]
    inits = [numpy_helper.from_array(np.array(0, np.int64), "zero"), numpy_helper.from_array(np.array(True), "true")]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("X", TensorProto.FLOAT, ["T", "N", 4]),
                                           helper.make_tensor_value_info("acc0", TensorProto.FLOAT, ["N", 4])],
                              [helper.make_tensor_value_info("total", TensorProto.FLOAT, ["N", 4])], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_loop_that_is_no_cell_names_the_node_and_why():
    model = _running_sum_loop()
    _ort(model, {"X": np.ones((3, 2, 4), np.float32), "acc0": np.zeros((2, 4), np.float32)})  # a valid model
    with pytest.raises(tvmrnn.UnsupportedModelError, match="Loop node 'running_sum': its body is not a recurrent cell"):
        tvmrnn.compile(model, target="llvm")


def _scan_rnn(hidden=6, features=4):
    """An RNN (tanh) cell step as a Scan body over a time-major X, with Y and the last state out."""
    rng = np.random.default_rng(3)
    w, r, b = (rng.standard_normal(s).astype(np.float32) * 0.5 for s in ((features, hidden), (hidden, hidden), (hidden,)))
    body = helper.make_graph(
        [helper.make_node("MatMul", ["x_t", "W"], ["xw"]), helper.make_node("MatMul", ["h", "R"], ["hr"]),
         helper.make_node("Add", ["xw", "b"], ["xwb"]), helper.make_node("Add", ["xwb", "hr"], ["pre"]),
         helper.make_node("Tanh", ["pre"], ["h_new"]), helper.make_node("Identity", ["h_new"], ["y_t"])],
        "body", [helper.make_tensor_value_info("h", TensorProto.FLOAT, ["N", hidden]),
                 helper.make_tensor_value_info("x_t", TensorProto.FLOAT, ["N", features])],
        [helper.make_tensor_value_info("h_new", TensorProto.FLOAT, ["N", hidden]),
         helper.make_tensor_value_info("y_t", TensorProto.FLOAT, ["N", hidden])],
        [numpy_helper.from_array(w, "W"), numpy_helper.from_array(r, "R"), numpy_helper.from_array(b, "b")])
    scan = helper.make_node("Scan", ["h0", "X"], ["h_last", "Y"], name="rnn_scan", body=body, num_scan_inputs=1)
    graph = helper.make_graph([scan], "g", [helper.make_tensor_value_info("X", TensorProto.FLOAT, ["T", "N", features]),
                                            helper.make_tensor_value_info("h0", TensorProto.FLOAT, ["N", hidden])],
                              [helper.make_tensor_value_info("h_last", TensorProto.FLOAT, ["N", hidden]),
                               helper.make_tensor_value_info("Y", TensorProto.FLOAT, ["T", "N", hidden])])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_scan_rnn_body_imports_as_rnn():
    model = _scan_rnn()
    assert [n.op_type for n in rewrite_recurrent_loops(model).graph.node].count("RNN") == 1
    module = tvmrnn.compile(model, target="llvm")
    rng = np.random.default_rng(0)
    _assert_matches(module, model, {"X": rng.standard_normal((7, 3, 4)).astype(np.float32),
                                    "h0": rng.standard_normal((3, 6)).astype(np.float32)})


def _reverse_then_first_step(time_axis):
    """ReverseSequence with lengths given at run time, then the first step (Slice [0:1] + Squeeze) and the whole."""
    batch_axis = 1 - time_axis
    x_dims = ["T", "N", 3] if time_axis == 0 else ["N", "T", 3]
    nodes = [helper.make_node("ReverseSequence", ["X", "lens"], ["rev"], time_axis=time_axis, batch_axis=batch_axis),
             helper.make_node("Slice", ["rev", "zero", "one", "axis"], ["first"]),
             helper.make_node("Squeeze", ["first", "axis"], ["first_step"])]
    inits = [numpy_helper.from_array(np.array([v], np.int64), k) for k, v in (("zero", 0), ("one", 1), ("axis", time_axis))]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("X", TensorProto.FLOAT, x_dims),
                                           helper.make_tensor_value_info("lens", TensorProto.INT64, ["N"])],
                              [helper.make_tensor_value_info("rev", TensorProto.FLOAT, None),
                               helper.make_tensor_value_info("first_step", TensorProto.FLOAT, None)], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


@pytest.mark.parametrize("time_axis", [0, 1])
def test_reverse_sequence_with_lengths_and_first_step(time_axis):
    model = _reverse_then_first_step(time_axis)
    module = tvmrnn.compile(model, target="llvm")
    rng = np.random.default_rng(time_axis)
    shape = (6, 4, 3) if time_axis == 0 else (4, 6, 3)
    _assert_matches(module, model, {"X": rng.standard_normal(shape).astype(np.float32),
                                    "lens": np.array([6, 1, 3, 5], np.int64)})
