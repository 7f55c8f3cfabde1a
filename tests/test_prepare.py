"""frontend.prepare (fixed dims, constant inputs, folding) and frontend.ops: what they fix, and the one-line errors for
what stays unsupported."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto as T
from onnx import helper as h

import tvmrnn
from tvmrnn.frontend.prepare import prepare


def _model(nodes, inputs, outputs, inits=()):
    graph = h.make_graph(nodes, "g", inputs, outputs, list(inits))
    return h.make_model(graph, opset_imports=[h.make_opsetid("", 17)])


def _pad_by_rate():
    """Pads computed from an input (`rate` 16000 -> pad 2 on the right, else 1), in an If as torch's tracer writes."""
    def branch(pad, name):
        const = h.make_node("Constant", [], [f"pads_{name}"], value=h.make_tensor("v", T.INT64, [4], [0, 0, 0, pad]))
        out = h.make_node("Pad", ["x", f"pads_{name}"], [f"y_{name}"], mode="reflect", name=f"pad_{name}")
        return h.make_graph([const, out], name, [], [h.make_tensor_value_info(f"y_{name}", T.FLOAT, None)])

    nodes = [h.make_node("Equal", ["rate", "r16k"], ["is16k"]),
             h.make_node("If", ["is16k"], ["y"], then_branch=branch(2, "then"), else_branch=branch(1, "else"), name="by_rate")]
    return _model(nodes, [h.make_tensor_value_info("x", T.FLOAT, ["batch", "n"]), h.make_tensor_value_info("rate", T.INT64, [])],
                  [h.make_tensor_value_info("y", T.FLOAT, None)], [onnx.numpy_helper.from_array(np.array(16000), "r16k")])


def test_const_input_specializes_an_if_and_its_computed_pads():
    model = _pad_by_rate()
    module = tvmrnn.compile(model, target="llvm", logs=False, consts={"rate": 16000}, input_shapes={"n": 6})
    assert [i["name"] for i in module.metadata["inputs"]] == ["x"]
    x = np.random.default_rng(0).standard_normal((3, 6)).astype(np.float32)
    want = ort.InferenceSession(model.SerializeToString()).run(None, {"x": x, "rate": np.array(16000)})[0]
    np.testing.assert_allclose(module.run({"x": x})["y"], want, rtol=1e-6)


def test_prepare_fixes_dims_by_name_and_whole_input_shapes():
    model = _pad_by_rate()
    by_dim = prepare(model, {"n": 6}, {"rate": 8000})
    by_input = prepare(model, {"x": [2, 6]}, {"rate": 8000})
    dims = lambda m: [d.dim_value or d.dim_param for d in m.graph.input[0].type.tensor_type.shape.dim]  # noqa: E731
    assert dims(by_dim) == ["batch", 6] and dims(by_input) == [2, 6]
    assert "If" not in {n.op_type for n in by_dim.graph.node}


@pytest.mark.parametrize("shapes, consts, words", [
    ({"width": 3}, None, "neither an input"),
    ({"x": [2]}, None, "has 1 dims"),
    ({"n": 0}, None, "positive"),
    (None, {"sr": 1}, "not an input"),
])
def test_bad_specializations_are_named(shapes, consts, words):
    with pytest.raises(tvmrnn.UnsupportedModelError, match=words):
        prepare(_pad_by_rate(), shapes, consts)


def test_squeeze_without_axes():
    def squeeze(shape):
        return _model([h.make_node("Squeeze", ["x"], ["y"], name="sq")], [h.make_tensor_value_info("x", T.FLOAT, shape)],
                      [h.make_tensor_value_info("y", T.FLOAT, None)])

    x = np.random.default_rng(1).standard_normal((3, 1, 4)).astype(np.float32)
    assert np.array_equal(tvmrnn.compile(squeeze([3, 1, 4]), target="llvm", logs=False).run({"x": x})["y"], x[:, 0])
    with pytest.raises(tvmrnn.UnsupportedModelError, match=r"node 'sq' \(Squeeze without axes\).*symbolic extents \['n'\]"):
        tvmrnn.compile(squeeze(["n", 1, 4]), target="llvm", logs=False)


def test_converter_failures_name_the_node():
    model = _model([h.make_node("Pad", ["x", "p"], ["y"], name="pad_by_input")],
                   [h.make_tensor_value_info("x", T.FLOAT, [2, 3]), h.make_tensor_value_info("p", T.INT64, [4])],
                   [h.make_tensor_value_info("y", T.FLOAT, None)])
    with pytest.raises(tvmrnn.UnsupportedModelError, match=r"node 'pad_by_input' \(Pad\): .*[Dd]ynamic pads"):
        tvmrnn.compile(model, target="llvm", logs=False)


def _backward_by_reversal(hidden=8, size=4):
    """A bidirectional layer as other frameworks' exporters write it: a forward LSTM, and one over the input reversed by
    Slice with step -1 whose output is reversed back, concatenated (sequence length symbolic)."""
    rng = np.random.default_rng(2)
    weights = {n: rng.standard_normal((1, 4 * hidden, k)).astype(np.float32) * 0.3
               for n, k in (("W", size), ("R", hidden), ("W2", size), ("R2", hidden))}
    ints = {"start": [-1], "end": [np.iinfo(np.int64).min], "axis": [0], "step": [-1]}
    inits = [onnx.numpy_helper.from_array(v, n) for n, v in weights.items()]
    inits += [onnx.numpy_helper.from_array(np.array(v, np.int64), n) for n, v in ints.items()]
    nodes = [h.make_node("Slice", ["x", *ints], ["xr"], name="reverse_in"),
             h.make_node("LSTM", ["x", "W", "R"], ["yf"], hidden_size=hidden, name="forward"),
             h.make_node("LSTM", ["xr", "W2", "R2"], ["ybr"], hidden_size=hidden, name="backward"),
             h.make_node("Slice", ["ybr", *ints], ["yb"], name="reverse_out"),
             h.make_node("Concat", ["yf", "yb"], ["y"], axis=-1)]
    return _model(nodes, [h.make_tensor_value_info("x", T.FLOAT, ["T", "N", size])], [h.make_tensor_value_info("y", T.FLOAT, None)],
                  inits)


def test_sequence_reversed_by_slice_matches_onnxruntime():
    model = _backward_by_reversal()
    module = tvmrnn.compile(model, target="llvm", logs=False)
    for steps in (7, 3):
        x = np.random.default_rng(steps).standard_normal((steps, 2, 4)).astype(np.float32)
        want = ort.InferenceSession(model.SerializeToString()).run(None, {"x": x})[0]
        np.testing.assert_allclose(module.run({"x": x})["y"], want, rtol=1e-5, atol=1e-6)


def test_cli_dim_and_const(tmp_path):
    import json

    from click.testing import CliRunner

    from tvmrnn.cli import main

    source = tmp_path / "pad_by_rate.onnx"
    onnx.save(_pad_by_rate(), source)
    out = tmp_path / "m.so"
    result = CliRunner().invoke(main, ["compile", str(source), "-o", str(out), "--target", "llvm", "--logs", str(tmp_path),
                                       "--dim", "x=2,6", "--const", "rate=16000"])
    assert result.exit_code == 0, result.output
    inputs = json.loads((tmp_path / "m.json").read_text())["inputs"]
    assert inputs == [{"name": "x", "dtype": "float32", "shape": [2, 6]}]
    bad = CliRunner().invoke(main, ["compile", str(source), "-o", str(out), "--target", "llvm", "--dim", "n=six"])
    assert bad.exit_code != 0 and "--dim" in bad.output
