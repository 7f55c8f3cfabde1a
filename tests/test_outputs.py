"""Model outputs glued from a recurrent node's Y the way exporters glue it (tvmrnn.frontend.outputs): the kernel writes
Y in the output's shape and no copy kernel runs; where the glue moves bytes or Y is read elsewhere, nothing folds."""

from __future__ import annotations

import dataclasses

import numpy as np
import onnxruntime as ort
import pytest
from onnx import helper, numpy_helper

import tvmrnn
from onnx_cases import Case
from tvmrnn.frontend.outputs import fold_output_glue


def glued_model(case: Case, glue: str, opset: int = 14, y_too: bool = False):
    """One recurrent node whose Y reaches the graph's output through the glue (squeeze: Squeeze(axes=[1]), axes an
    input from opset 13, an attribute before; transpose: Transpose(perm=[0, 2, 1, 3]) + Reshape([0, 0, -1])); y_too:
    Y itself an output as well."""
    inits = [numpy_helper.from_array(v, k) for k, v in case.weights().items()]
    inits += [numpy_helper.from_array(np.array([1], np.int64), "axis1"), numpy_helper.from_array(np.array([0, 0, -1], np.int64), "flatten")]
    names = [n if n in ("X", "W", "R", "B") else "" for n in case.input_names]
    nodes = [helper.make_node(case.op, names, ["Y0"], name="rnn", **case.attrs())]
    if glue == "squeeze":
        nodes.append(helper.make_node("Squeeze", ["Y0", "axis1"], ["Y"]) if opset >= 13 else helper.make_node("Squeeze", ["Y0"], ["Y"], axes=[1]))
    else:
        nodes += [helper.make_node("Transpose", ["Y0"], ["Yt"], perm=[0, 2, 1, 3]), helper.make_node("Reshape", ["Yt", "flatten"], ["Y"])]
    outputs = [helper.make_tensor_value_info("Y", 1, None)] + ([helper.make_tensor_value_info("Y0", 1, None)] if y_too else [])
    graph = helper.make_graph(nodes, "glued", [helper.make_tensor_value_info("X", 1, ["seq", "batch", case.input_size])], outputs, inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)], ir_version=8)


def _run_both(model, case, seed):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((7, 3, case.input_size)).astype("float32")
    module = tvmrnn.compile(model, target="llvm", logs=False)
    ours = module.run({"X": x})
    want = dict(zip([o.name for o in model.graph.output], ort.InferenceSession(model.SerializeToString()).run(None, {"X": x})))
    for name, ref in want.items():
        assert ours[name].shape == ref.shape, name
        assert np.abs(ours[name] - ref).max() / np.abs(ref).max() < 1e-5, name
    return module


@pytest.mark.parametrize("glue, opset", [("squeeze", 14), ("squeeze", 11), ("transpose", 14)])
@pytest.mark.parametrize("op, direction", [("LSTM", "forward"), ("GRU", "reverse"), ("RNN", "forward")])
def test_glued_output_is_written_by_the_kernel(op, direction, glue, opset):
    """The node takes the output's name and the glue goes (fold_output_glue); the module's output matches ONNX Runtime
    on the unfolded model (fresh inputs), the layer says y_squeezed, and no copy kernel runs: only views
    (vm.builtin.reshape) between the kernels and the output."""
    case = Case(op=op, hidden=12, input_size=6, direction=direction, outputs=("Y0",), seed=3)
    model = glued_model(case, glue, opset)
    folded, squeezed = fold_output_glue(model, set())
    assert squeezed == {0} and [n.op_type for n in folded.graph.node] == [op] and folded.graph.node[0].output[0] == "Y"
    module = _run_both(model, case, seed=len(glue) + opset)
    assert module.metadata["layers"][0]["y_squeezed"]
    calls = [line.split()[1] for line in module.executable.as_text().splitlines() if line.strip().startswith("call")]
    assert not [c for c in calls if ("reshape" in c or "transpose" in c or "squeeze" in c) and c != "vm.builtin.reshape"], calls


@pytest.mark.parametrize("why", ["bidirectional", "y_too", "stacked"])
def test_glue_stays_where_folding_would_change_something(why):
    """Two directions (the transpose moves bytes), Y an output itself, and a node in a chain (skip: stacked layers run
    as one kernel) keep the glue; the first two still match ONNX Runtime."""
    case = Case(op="LSTM", hidden=12, input_size=6, direction="bidirectional" if why == "bidirectional" else "forward", outputs=("Y0",))
    model = glued_model(case, "transpose", y_too=why == "y_too")
    folded, squeezed = fold_output_glue(model, {0} if why == "stacked" else set())
    assert squeezed == set() and folded is model
    if why != "stacked":
        assert not _run_both(model, case, seed=5).metadata["layers"][0]["y_squeezed"]


def test_cuda_keeps_the_glue_for_now():
    """On CUDA the glue stays (its kernels take the same view, not yet run on a GPU): the export-only module's layer
    writes the 4-D Y."""
    case = Case(op="LSTM", hidden=12, input_size=6, outputs=("Y0",))
    module = tvmrnn.compile(glued_model(case, "squeeze"), target="cuda", logs=False)
    assert not module.metadata["layers"][0]["y_squeezed"]


def test_tuning_keys_ignore_the_squeeze():
    """A layer's tuning records serve it whether or not its Y is squeezed (the same kernel)."""
    from tvmrnn.frontend.inspect import find_rnn_layers
    from tvmrnn.tuning.tasks import layer_key

    spec = find_rnn_layers(glued_model(Case(op="GRU", hidden=12, input_size=6, outputs=("Y0",)), "squeeze"))[0].spec
    assert layer_key(spec) == layer_key(dataclasses.replace(spec, y_squeezed=True))
