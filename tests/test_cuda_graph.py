"""Whole runs as CUDA graphs (tvmrnn.cuda_graph): the plan, the bounds a module records and enforces, and on a GPU the
captured and replayed runs against the float64 reference, shape after shape."""

from __future__ import annotations

import numpy as np
import pytest
import tvm

import tvmrnn
from onnx_cases import Case
from test_conformance import OPTIONAL
from tvmrnn import bench
from tvmrnn.errors import InputError, UnsupportedModelError

CASE = Case(op="LSTM", direction="bidirectional", optional=OPTIONAL["LSTM"], hidden=48, input_size=20, clip=3.0)
# stacked layers glued as exporters do (Transpose + Reshape), so kernels run between the input and the output
LSTM_BI = bench.Row("graph-lstm", "LSTM", 40, 17, 20, 48, 2, True)
GRU_FP16 = bench.Row("graph-gru", "GRU", 30, 40, 24, 64, 2)  # fp16 at batch 33-40 runs a launch per step (mma)
BOUNDS = {"seq": 40, "batch": 17}


def _row_model(row, dtype="float32"):
    return bench.onnx_model(bench.torch_module(row), row, dtype)


def test_bounded_cuda_build_captures_the_recurrent_kernels():
    """Built through NVRTC where there is no GPU: the run is lifted into a captured function holding the layers' kernels."""
    module = tvmrnn.compile(_row_model(LSTM_BI), target="cuda", max_dims=BOUNDS, logs=False)
    assert module.metadata["cuda_graph"].startswith("on: seq <= 40, batch <= 17")
    assert module.metadata["max_dims"] == BOUNDS
    text = module.executable.as_text()
    captured = text[text.index("@main_cuda_graph_capture:"):].split("\n\n", 1)[0]  # that function's instructions
    assert {"rnn_lstm0", "rnn_lstm1"} <= {line.split()[1] for line in captured.splitlines() if line.strip().startswith("call")}


def test_a_kernel_writing_the_outputs_is_not_captured_and_the_module_says_so():
    """TVM allocates a function's outputs per call, so a lone node (its kernel writes Y, Y_h, Y_c) has nothing to capture."""
    module = tvmrnn.compile(CASE.model(), target="cuda", max_dims=BOUNDS, logs=False)
    assert module.metadata["cuda_graph"].startswith("off (no kernel runs between")
    assert "cuda_graph.run_or_capture" not in module.executable.as_text()


def test_without_bounds_there_is_no_graph_and_the_log_says_which_dims_need_one():
    lines = []
    module = tvmrnn.compile(_row_model(LSTM_BI), target="cuda", logs=False, log=lines.append)
    assert module.metadata["cuda_graph"].startswith("off (give an upper bound for seq, batch")
    assert "cuda_graph.run_or_capture" not in module.executable.as_text()
    assert any("CUDA graph off" in line for line in lines)


@pytest.mark.parametrize("kwargs, message", [
    ({"cuda_graph": True}, "cuda_graph=True: give an upper bound for seq, batch"),
    ({"max_dims": {"time": 5}}, "max_dims names 'time', which no input of the model has; its symbolic dims are ['seq', 'batch']"),
    ({"max_dims": {"seq": 0}}, "max_dims['seq'] is 0; a bound is a positive integer"),
])
def test_bad_graph_options_are_refused_by_name(kwargs, message):
    with pytest.raises(UnsupportedModelError, match=message.replace("[", r"\[").replace("(", r"\(")):
        tvmrnn.compile(CASE.model(), target="cuda", logs=False, **kwargs)


def test_cpu_module_records_and_enforces_its_bounds(tmp_path):
    """The bounds hold on every target (buffers are planned for them): larger inputs are refused by name, also after export."""
    module = tvmrnn.compile(CASE.model(), target="llvm", max_dims={"seq": 6}, logs=False)
    assert module.metadata["cuda_graph"] == "off (CPU target)"
    rng = np.random.default_rng(0)
    feeds = CASE.feeds(rng, 6, 3)
    np.testing.assert_allclose(module.run(feeds)["Y"], CASE.reference(feeds)["Y"], rtol=1e-4, atol=1e-5)
    loaded = tvmrnn.load(module.export(tmp_path / "m.so"))
    big = CASE.feeds(rng, 7, 3)
    for m in (module, loaded):
        with pytest.raises(InputError, match=r"input 'X' has seq=7; this module was compiled for seq <= 6"):
            m.run(big)
        # inputs already on the device skip the other checks, not the bounds
        on_device = [tvm.runtime.tensor(big[i["name"]], m.device) for i in m.metadata["inputs"]]
        with pytest.raises(InputError, match=r"input 'X' has seq=7; this module was compiled for seq <= 6"):
            m.invoke(on_device)


@pytest.mark.gpu
@pytest.mark.parametrize("row, dtype, shapes, tol", [
    (LSTM_BI, "float32", [(12, 5), (40, 17), (3, 1), (12, 5), (40, 17)], 1e-5),
    (GRU_FP16, "float16", [(30, 40), (7, 33), (30, 40), (5, 3)], 1e-2),
], ids=["lstm-bi-fp32", "gru-fp16-per-step"])
def test_graph_runs_match_float64_shape_after_shape(row, dtype, shapes, tol):
    """Each new (seq, batch) is a capture, a repeated one a replay of it; every run against float64 PyTorch, so a replay
    that saw another shape's data or sizes shows."""
    import torch

    module = tvmrnn.compile(_row_model(row, dtype), target="cuda", max_dims={"seq": row.T, "batch": row.N}, cuda_graph=True,
                            logs=False)
    reference = bench.torch_module(row).double()
    rng = np.random.default_rng(5)
    for T, N in shapes:
        x = rng.standard_normal((T, N, row.I)).astype(dtype)
        with torch.no_grad():
            ref = reference(torch.from_numpy(x.astype("float64")))[0].numpy()
        y = module.run({"X": x})["Y"].astype("float64")
        err = np.abs(y - ref).max() / np.abs(ref).max()
        assert err < tol, f"T={T} N={N}: rel. error {err:.2e}"
