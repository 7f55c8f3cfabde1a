"""Token models as PyTorch exports them: Embedding -> (Transpose) -> GRU/LSTM called without an initial state. The
zero state (ConstantOfShape) is left out at import, the layer's projection is the embedding table's own, computed at
compile time (plan kind "table"), and the numbers are ONNX Runtime's, negative indices included."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest

import tvmrnn
from models.zoo.export import export
from schedules.layer import INPUT_NAMES
from tvmrnn.build import resolve_target
from tvmrnn.frontend import load_onnx
from tvmrnn.plan import plan_model

VOCAB, EMBED, HIDDEN, CLASSES = 30, 16, 24, 7


def _token_model(tmp_path, op: str, bidirectional: bool, name: str = "tokens"):
    import torch
    from torch import nn

    class Tokens(nn.Module):
        def __init__(self):
            super().__init__()
            self.emb = nn.Embedding(VOCAB, EMBED)
            self.rnn = getattr(nn, op)(EMBED, HIDDEN, batch_first=True, bidirectional=bidirectional)
            self.fc = nn.Linear(HIDDEN * (2 if bidirectional else 1), CLASSES)

        def forward(self, ids):
            y, _ = self.rnn(self.emb(ids))
            return self.fc(y)

    torch.manual_seed(0)
    path = tmp_path / f"{name}.onnx"
    export(Tokens().eval(), (torch.randint(0, VOCAB, (2, 5)),), path, "legacy", ["ids"], ["logits"],
           {"ids": {0: "batch", 1: "steps"}})
    return onnx.load(str(path))


def _rnn_node(model):
    return next(n for n in model.graph.node if n.op_type in INPUT_NAMES)


@pytest.mark.parametrize("op, bidirectional", [("GRU", False), ("LSTM", True)])
def test_token_rnn_drops_its_zero_state_and_looks_up_its_projection(tmp_path, op, bidirectional):
    model = _token_model(tmp_path, op, bidirectional)
    assert any(n.op_type == "ConstantOfShape" for n in model.graph.node)  # torch's zero initial state
    node = _rnn_node(load_onnx(model))
    present = {k for k, v in zip(INPUT_NAMES[node.op_type], node.input) if v}
    assert present == {"X", "W", "R", "B"}, list(node.input)

    layer = plan_model(model, resolve_target("llvm")).layers[0]
    assert layer.projection.kind == "table" and f"{VOCAB}-row embedding" in layer.projection.label
    module = tvmrnn.compile(model, target="llvm", logs=False)
    assert module.metadata["layers"][0]["projection"] == layer.projection.label
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    rng = np.random.default_rng(1)
    for batch, steps in ((3, 7), (1, 2), (5, 4)):
        ids = rng.integers(-VOCAB, VOCAB, (batch, steps)).astype(np.int64)  # ONNX Gather takes negative indices
        want = session.run(None, {"ids": ids})[0]
        got = module.run({"ids": ids})["logits"]
        assert np.abs(got - want).max() <= 1e-5 * np.abs(want).max()


def test_a_table_too_large_to_fold_or_not_constant_keeps_the_gemm(tmp_path, monkeypatch):
    """The table is computed at compile time, from constants only and within TABLE_MAX_MACS: past the bound, or with
    the embedding's table an input of the graph, the projection is the CPU GEMM again (and the numbers the same)."""
    from tvmrnn.plan import projection

    model = _token_model(tmp_path, "GRU", False)
    monkeypatch.setattr(projection, "TABLE_MAX_MACS", VOCAB * EMBED * 3 * HIDDEN - 1)
    assert plan_model(model, resolve_target("llvm")).layers[0].projection.kind == "cpu"
    monkeypatch.undo()
    gather = next(n for n in model.graph.node if n.op_type == "Gather" and n.input[0] in {i.name for i in model.graph.initializer})
    table = next(i for i in model.graph.initializer if i.name == gather.input[0])
    model.graph.initializer.remove(table)
    model.graph.input.append(onnx.helper.make_tensor_value_info(table.name, table.data_type, list(table.dims)))
    layer = plan_model(model, resolve_target("llvm")).layers[0]
    assert layer.projection.kind == "cpu", layer.projection
    module = tvmrnn.compile(model, target="llvm", logs=False)
    ids = np.random.default_rng(2).integers(0, VOCAB, (3, 6)).astype(np.int64)
    feeds = {"ids": ids, table.name: onnx.numpy_helper.to_array(table)}
    want = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)[0]
    assert np.abs(module.run(feeds)["logits"] - want).max() <= 1e-5 * np.abs(want).max()
