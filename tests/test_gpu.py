"""The CUDA path on a GPU: whole models compiled for the local GPU against the float64 reference and ONNX Runtime.

Run on the device with `pytest -m gpu`; skipped where there is no GPU.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

import tvmrnn
from onnx_cases import Case
from test_conformance import OPTIONAL, ort_outputs

pytestmark = pytest.mark.gpu

CASES = [
    Case(op="LSTM", direction="bidirectional", optional=OPTIONAL["LSTM"], hidden=64, input_size=24, clip=3.0),
    Case(op="LSTM", direction="reverse", optional=("B", "sequence_lens"), layout=1, hidden=100, input_size=17, input_forget=1),
    Case(op="LSTM", optional=("B",), hidden=256, input_size=128, activations=("HardSigmoid", "LeakyRelu", "Softsign"),
         activation_alpha=(0.3, 0.05), activation_beta=(0.4,)),
    Case(op="GRU", direction="bidirectional", optional=OPTIONAL["GRU"], hidden=96, input_size=40, linear_before_reset=1),
    Case(op="GRU", direction="forward", optional=OPTIONAL["GRU"], hidden=96, input_size=40, layout=1, weights_as_inputs=True),
    Case(op="RNN", direction="bidirectional", optional=OPTIONAL["RNN"], hidden=513, input_size=31, activations=("Relu", "Tanh")),
]


@pytest.mark.parametrize("case", CASES, ids=lambda c: f"{c.op}-{c.direction}-H{c.hidden}-layout{c.layout}")
def test_cuda_matches_reference_and_onnxruntime(case):
    module = tvmrnn.compile(case.model(), target="cuda")
    assert module.metadata["target_kind"] == "cuda"
    rng = np.random.default_rng(3)
    for T, N in ((12, 5), (3, 1), (40, 17)):
        feeds = case.feeds(rng, T, N)
        ours = module.run(feeds)
        ref, ort = case.reference(feeds), ort_outputs(case, feeds)
        for name, value in ours.items():
            np.testing.assert_allclose(value, ref[name], rtol=1e-4, atol=1e-5, err_msg=f"{name} vs reference T={T} N={N}")
            np.testing.assert_allclose(value, ort[name], rtol=1e-4, atol=1e-5, err_msg=f"{name} vs ONNX Runtime T={T} N={N}")


def test_cuda_export_and_load(tmp_path):
    case = dataclasses.replace(CASES[0], hidden=32)
    path = tvmrnn.compile(case.model(), target="cuda").export(tmp_path / "m.so")
    loaded = tvmrnn.load(path)
    feeds = case.feeds(np.random.default_rng(0), 6, 3)
    ref = case.reference(feeds)
    for name, value in loaded.run(feeds).items():
        np.testing.assert_allclose(value, ref[name], rtol=1e-4, atol=1e-5)
