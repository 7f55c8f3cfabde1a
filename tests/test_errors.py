"""Bad models and bad inputs raise UnsupportedModelError / InputError naming what is wrong, never crash."""

from __future__ import annotations

import dataclasses

import numpy as np
import onnx
import pytest

import tvmrnn
from onnx_cases import Case


def _set_attr(model, name, value):
    node = model.graph.node[0]
    for a in list(node.attribute):
        if a.name == name:
            node.attribute.remove(a)
    node.attribute.append(onnx.helper.make_attribute(name, value))
    return model


def _bad_models():
    lstm = Case(op="LSTM", optional=("B", "sequence_lens"))
    yield "direction", _set_attr(lstm.model(), "direction", "sideways"), ["direction", "sideways", "bidirectional"]
    yield "activation name", _set_attr(lstm.model(), "activations", ["Sigmoid", "Tanh", "Gelu"]), ["Gelu", "Softplus"]
    yield "activation count", _set_attr(lstm.model(), "activations", ["Sigmoid", "Tanh"]), ["activations", "3 function"]
    yield "extra alpha", _set_attr(lstm.model(), "activation_alpha", [0.5]), ["activation_alpha", "more values"]
    yield "layout value", _set_attr(lstm.model(), "layout", 2), ["layout", "2"]
    yield "layout at opset 7", _set_attr(dataclasses.replace(lstm, opset=7).model(), "layout", 1), ["layout", "opset 7"]
    yield "clip", _set_attr(lstm.model(), "clip", -1.0), ["clip", "-1.0", "positive"]
    yield "hidden_size", _set_attr(lstm.model(), "hidden_size", 9), ["hidden_size is 9 while W holds 32 rows (4 x 8)"]
    yield "input_forget on GRU", _set_attr(Case(op="GRU").model(), "input_forget", 1), ["input_forget", "GRU"]
    yield "unknown attribute", _set_attr(lstm.model(), "output_sequence", 1), ["output_sequence"]
    yield "opset 6", dataclasses.replace(lstm).model(), None  # replaced below
    double = Case(op="RNN").model()
    double.graph.input[0].type.tensor_type.elem_type = onnx.TensorProto.DOUBLE
    yield "float64", double, ["element type", "float64", "float32"]


def _models():
    for name, model, words in _bad_models():
        if name == "opset 6":
            model.opset_import[0].version = 6
            words = ["opset", "6", "7 to 22"]
        yield pytest.param(model, words, id=name)


@pytest.mark.parametrize("model,words", _models())
def test_bad_model_is_refused_by_name(model, words):
    with pytest.raises(tvmrnn.UnsupportedModelError) as info:
        tvmrnn.compile(model, target="llvm")
    msg = str(info.value)
    assert "node 'lstm_node'" in msg or "node 'gru_node'" in msg or "node 'rnn_node'" in msg, msg
    for w in words:
        assert w in msg, (w, msg)


def test_missing_and_unreadable_files(tmp_path):
    with pytest.raises(tvmrnn.UnsupportedModelError, match="does not exist"):
        tvmrnn.compile(tmp_path / "nope.onnx", target="llvm")
    junk = tmp_path / "junk.onnx"
    junk.write_bytes(b"\x00not a model")
    with pytest.raises(tvmrnn.UnsupportedModelError, match="not a readable ONNX model"):
        tvmrnn.compile(junk, target="llvm")
    with pytest.raises(tvmrnn.UnsupportedModelError, match="not a TVM target"):
        tvmrnn.compile(Case().model(), target="nosuchtarget")
    with pytest.raises(tvmrnn.UnsupportedModelError, match="not a TVM target"):
        tvmrnn.compile(Case().model(), target={"kind": "nosuchkind"})


def test_cuda_kernel_asked_of_a_cpu_build():
    """kernel='persistent_mma' (or any CUDA kind) with an llvm target is refused by name, not silently dropped."""
    with pytest.raises(tvmrnn.UnsupportedModelError, match="kernel 'persistent_mma' is a CUDA kernel and the target is llvm"):
        tvmrnn.compile(Case(op="LSTM").model(), target="llvm", kernel="persistent_mma", logs=False)


def test_target_as_a_json_dict():
    """TVM 0.27 targets are JSON dicts too: one is taken as it is (it was once looked up in the alias table and crashed)."""
    from tvmrnn.build import resolve_target

    target = resolve_target({"kind": "cuda", "arch": "sm_80"})
    assert target.kind.name == "cuda" and str(target.attrs["arch"]) == "sm_80"
    assert tvmrnn.compile(Case().model(), target={"kind": "llvm"}, logs=False).metadata["target"]


@pytest.fixture(scope="module")
def lstm_module():
    return tvmrnn.compile(Case(op="LSTM", optional=("B", "sequence_lens", "initial_h")).model(), target="llvm")


def _feeds(T=4, N=2):
    rng = np.random.default_rng(0)
    return {"X": rng.standard_normal((T, N, 5)).astype("f4"), "sequence_lens": np.array([4, 2], "i4")[:N],
            "initial_h": np.zeros((1, N, 8), "f4")}


@pytest.mark.parametrize("change,words", [
    (lambda f: f.pop("X"), ["missing input 'X'"]),
    (lambda f: f.update(Z=f["X"]), ["unknown input 'Z'"]),
    (lambda f: f.update(X=f["X"].astype("f8")), ["'X'", "float64", "float32"]),
    (lambda f: f.update(X=f["X"][0]), ["'X'", "rank 3"]),
    (lambda f: f.update(X=f["X"][:, :, :3]), ["'X'", "axis 2 must be 5"]),
    (lambda f: f.update(initial_h=np.zeros((1, 3, 8), "f4")), ["initial_h", "batch"]),
    (lambda f: f.update(sequence_lens=np.array([4, 9], "i4")), ["sequence_lens", "9", "row 1", "[1, 4]"]),
    (lambda f: f.update(sequence_lens=np.array([0, 1], "i4")), ["sequence_lens", "0", "row 0"]),
    (lambda f: f.update(X=f["X"][:0]), ["'X' has no time steps", "sequence_lens"]),
])
def test_bad_run_input_names_it(lstm_module, change, words):
    """Each bad feed comes after good ones of the same names, dtypes and shapes (check_inputs' shortcut for them)."""
    lstm_module.run(_feeds())
    feeds = _feeds()
    change(feeds)
    with pytest.raises(tvmrnn.InputError) as info:
        lstm_module.run(feeds)
    for w in words:
        assert w in str(info.value), (w, str(info.value))
    # and the module still works afterwards
    assert lstm_module.run(_feeds())["Y"].shape == (4, 1, 2, 8)


def test_load_errors(tmp_path):
    with pytest.raises(tvmrnn.InputError, match="does not exist"):
        tvmrnn.load(tmp_path / "none.so")
    (tmp_path / "m.so").write_bytes(b"x")
    (tmp_path / "m.json").write_text('{"format": "other"}')
    with pytest.raises(tvmrnn.InputError, match="not tvmrnn module metadata"):
        tvmrnn.load(tmp_path / "m.so")


def test_out_of_range_token_id_is_refused():
    """The zoo's LSTM language model indexes an embedding of 1000 rows with its 'tokens' input."""
    import os

    module = tvmrnn.compile(os.path.join(os.path.dirname(__file__), "..", "models", "lstm_lm.onnx"), target="llvm")
    assert module.metadata["index_bounds"] == {"tokens": 1000}
    tokens = np.zeros((5, 2), np.int64)
    tokens[3, 1] = 1000
    with pytest.raises(tvmrnn.InputError, match=r"'tokens' has 1000 at flat position 7.*\[-1000, 999\]"):
        module.run({"tokens": tokens})
    tokens[3, 1] = 999
    assert module.run({"tokens": tokens})["probs"].shape[-1] == 1000
