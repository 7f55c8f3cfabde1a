"""The ONNX package's own node test cases for LSTM, GRU and RNN (onnx.backend.test.case.node), on the CPU target."""

from __future__ import annotations

import warnings

import numpy as np
import pytest

import tvmrnn


def _rnn_cases():
    from onnx.backend.test.case.node import collect_testcases

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # other ops' case generators warn about overflows
        cases = collect_testcases(None)
    return [c for c in cases if {n.op_type for n in c.model.graph.node} & {"LSTM", "GRU", "RNN"}]


CASES = _rnn_cases()


def test_cases_were_found():
    assert len(CASES) >= 16, [c.name for c in CASES]


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_onnx_node_case(case):
    module = tvmrnn.compile(case.model, target="llvm")
    inputs = [i.name for i in case.model.graph.input if i.name not in {t.name for t in case.model.graph.initializer}]
    for feeds, expected in case.data_sets:
        outs = module.run(dict(zip(inputs, feeds)))
        names = [o.name for o in case.model.graph.output]
        assert len(outs) == len(expected)
        for name, want in zip(names, expected):
            np.testing.assert_allclose(outs[name], want, rtol=case.rtol, atol=max(case.atol, 1e-6), err_msg=f"{case.name}: {name}")
