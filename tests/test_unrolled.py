"""frontend.unrolled: PyTorch's dynamo exporter writes nn.RNN as a MatMul, Add and activation per step; such chains
import as one RNN node each, and the module matches ONNX Runtime on the exported graph."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest

import tvmrnn
from models.zoo.export import export
from tvmrnn.frontend import load_onnx

T, N, I, H = 6, 2, 8, 12


def _exported(tmp_path, nonlinearity, layers=2):
    import torch

    torch.manual_seed(0)

    class Net(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.rnn = torch.nn.RNN(I, H, layers, nonlinearity=nonlinearity, batch_first=True)

        def forward(self, x, h0):
            y, h = self.rnn(x, h0)
            return y, h

    path = tmp_path / f"rnn_{nonlinearity}.onnx"
    export(Net().eval(), (torch.rand(N, T, I), torch.zeros(layers, N, H)), path, "dynamo", ["x", "h0"], ["y", "h"], {})
    return onnx.load(str(path))


@pytest.mark.parametrize("nonlinearity", ["tanh", "relu"])
def test_dynamo_unrolled_rnn_imports_as_rnn_nodes_and_matches(tmp_path, nonlinearity):
    model = _exported(tmp_path, nonlinearity)
    act = {"tanh": "Tanh", "relu": "Relu"}[nonlinearity]
    assert sum(n.op_type == act for n in model.graph.node) == 2 * T  # as exported: one activation a step and layer
    loaded = load_onnx(model)
    assert [n.op_type for n in loaded.graph.node].count("RNN") == 2
    assert not any(n.op_type == act for n in loaded.graph.node)
    module = tvmrnn.compile(model, target="llvm", logs=False)
    assert len(module.metadata["layers"]) == 2
    rng = np.random.default_rng(1)
    feeds = {"x": rng.standard_normal((N, T, I)).astype("float32"), "h0": rng.standard_normal((2, N, H)).astype("float32")}
    want = ort.InferenceSession(model.SerializeToString()).run(None, feeds)
    got = module.run(feeds)
    for name, ref in zip(("y", "h"), want):
        np.testing.assert_allclose(got[name], ref, rtol=1e-5, atol=1e-5, err_msg=name)


def test_a_chain_whose_steps_differ_stays_unrolled(tmp_path):
    """Steps multiplying by different weights are no recurrence of one cell: the graph is left as it is."""
    model = _exported(tmp_path, "tanh", layers=1)
    matmuls = [n for n in model.graph.node if n.op_type == "MatMul"]
    step = next(n for n in matmuls[2:] if n.input[1] == matmuls[1].input[1])  # a later step's R
    other = onnx.numpy_helper.from_array(np.eye(H, dtype="float32"), "other_R")
    model.graph.initializer.append(other)
    step.input[1] = "other_R"
    loaded = load_onnx(model)
    assert "RNN" not in [n.op_type for n in loaded.graph.node]
