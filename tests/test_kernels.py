"""The recurrent kernels alone, called with outputs poisoned (NaN) first, so any element a kernel fails to write shows.

Cases use no bias and no peepholes, so the kernel's inputs are plain: XW = X @ W^T for all steps
and directions, R as ONNX lays it out (or transposed, as the kernel asks). Padded steps
(sequence_lens) must come out as zeros, and repeated runs must agree to the last bit.
"""

from __future__ import annotations

import numpy as np
import pytest
import tvm

from onnx_cases import Case
from schedules import cooperative, recurrent_kernel
from tvmrnn.cells import cell_for
from tvmrnn.frontend.inspect import find_rnn_layers

TARGETS = [pytest.param(("llvm", "auto"), id="llvm")] + [
    pytest.param(("cuda", choice), id=f"cuda-{choice}", marks=pytest.mark.gpu) for choice in ("stepwise", "persistent", "auto")]
CASES = [
    Case(op="LSTM", direction="bidirectional", optional=("sequence_lens", "initial_h", "initial_c"), hidden=24, input_size=7),
    Case(op="GRU", direction="reverse", optional=("sequence_lens", "initial_h"), hidden=33, input_size=5, layout=1),
    Case(op="GRU", direction="bidirectional", optional=("sequence_lens",), hidden=16, input_size=3),
    Case(op="RNN", direction="forward", optional=("sequence_lens",), hidden=130, input_size=9),
]


def _target(kind):
    return tvm.target.Target("llvm") if kind == "llvm" else tvm.target.Target.from_device(tvm.cuda(0))


@pytest.mark.parametrize("kind", TARGETS)
@pytest.mark.parametrize("case", CASES, ids=lambda c: f"{c.op}-{c.direction}-layout{c.layout}")
def test_kernel_writes_every_element(kind, case):
    kind, choice = kind
    target = _target(kind)
    spec = find_rnn_layers(case.model())[0].spec
    cell = cell_for(spec)
    kernel = recurrent_kernel(spec, cell, target, choice)
    lib = tvm.compile(tvm.IRModule({"main": kernel.func}), target=target, tir_pipeline=cooperative.register())
    dev = tvm.device("cpu" if kind == "llvm" else "cuda", 0)
    rng = np.random.default_rng(7)
    T, H, D = 9, spec.hidden_size, spec.num_directions
    w = case.weights()
    # fresh inputs each time (a race shows as an error that moves); batch 40 takes auto's stepwise branch
    for trial, N in enumerate((5, 40, 3)):
        feeds = case.feeds(rng, T, N)
        x = feeds["X"]
        xw = x @ w["W"].reshape(D * cell.gates * H, -1).T
        r = w["R"].transpose(0, 2, 1).copy() if kernel.transposed_r else w["R"]
        args = [xw.astype("f4"), r]
        args += [feeds[n] for n in ("sequence_lens", "initial_h", "initial_c") if n in feeds and (n != "initial_c" or "c" in cell.states)]
        expected = case.reference(feeds)
        state_shape = (D, N, H) if spec.layout == 0 else (N, D, H)
        outs = [np.full((T, D, N, H) if spec.layout == 0 else (N, T, D, H), np.nan, "f4")]
        outs += [np.full(state_shape, np.nan, "f4") for _ in cell.states]
        dev_args = [tvm.runtime.tensor(np.ascontiguousarray(v), dev) for v in args + outs]
        results = []
        for _ in range(2):
            lib["main"](*dev_args)
            results.append([t.numpy() for t in dev_args[len(args):]])
        for got_first, got_again in zip(*results):
            np.testing.assert_array_equal(got_first, got_again)  # deterministic: same bits twice
        for name, got in zip(("Y", "Y_h", "Y_c"), results[0]):
            assert not np.isnan(got).any(), f"{name}: {np.isnan(got).sum()} elements never written"
            np.testing.assert_allclose(got, expected[name], rtol=1e-4, atol=1e-5, err_msg=f"{name}, trial {trial}")
