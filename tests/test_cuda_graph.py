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
from tvmrnn.runtime import OUTPUTS_TO_HOST, WHOLE_CALL, WHOLE_CALL_BUFFERS, module_function

CASE = Case(op="LSTM", direction="bidirectional", optional=OPTIONAL["LSTM"], hidden=48, input_size=20, clip=3.0)
# stacked layers glued as exporters do (Transpose + Reshape), so kernels run between the input and the output
LSTM_BI = bench.Row("graph-lstm", "LSTM", 40, 17, 20, 48, 2, True)
GRU_FP16 = bench.Row("graph-gru", "GRU", 30, 40, 24, 64, 2)  # fp16 at batch 33-40 runs a launch per step (mma)
BOUNDS = {"seq": 40, "batch": 17}


def _row_model(row, dtype="float32"):
    return bench.onnx_model(bench.torch_module(row), row, dtype)


@pytest.fixture(scope="module")
def bounded_stack():
    """The stacked LSTM built for CUDA with seq and batch bounded (through NVRTC where there is no GPU)."""
    return tvmrnn.compile(_row_model(LSTM_BI), target="cuda", max_dims=BOUNDS, logs=False)


def test_bounded_cuda_build_captures_the_recurrent_kernels(bounded_stack):
    """Built through NVRTC where there is no GPU: the run is lifted into a captured function holding the layers' kernels
    (the two layers' kernels are one function, named after the first: they read XW, so their input sizes do not
    enter them)."""
    module = bounded_stack
    assert module.metadata["cuda_graph"].startswith("on: seq <= 40, batch <= 17")
    assert module.metadata["max_dims"] == BOUNDS
    text = module.executable.as_text()
    assert _calls(text, "main_cuda_graph_capture").count("rnn_lstm0") == 2


def _calls(text: str, function: str) -> list[str]:
    """The kernels one VM function of an executable's text calls, in order."""
    body = text[text.index(f"@{function}:"):].split("\n\n", 1)[0]
    return [line.split()[1] for line in body.splitlines() if line.strip().startswith("call") and "builtin" not in line]


def _outside_the_graph(module) -> list[str]:
    text = module.executable.as_text()
    assert text.count("cuda_graph.run_or_capture in:") == 1  # one captured function, launched once a run
    return [c for c in _calls(text, "main") if not c.startswith("shape_func")]  # (the VM's shape arithmetic, on the host)


def test_every_kernel_but_the_boundary_copies_is_captured(bounded_stack):
    """TVM captures only kernels whose buffers it plans statically and allocates main's inputs and outputs per call:
    the tensor inputs and the outputs pass through copy kernels (cuda_graph.isolate_boundary) and every other kernel,
    the recurrent ones and the Transpose/Reshape glue around a stack alike, runs in the one graph."""
    model = CASE.model()
    lone = tvmrnn.compile(model, target="cuda", max_dims=BOUNDS, logs=False)
    assert _calls(lone.executable.as_text(), "main_cuda_graph_capture") == ["fused_matmul_add", "rnn_lstm_node"]  # X's projection too
    copies_in, copies_out = _outside_the_graph(lone)  # one launch copies every input, one every output
    assert copies_in == "copy_float32_3d_int32_1d_float32_3d_float32_3d"  # X, sequence_lens, initial_h, initial_c
    assert copies_out == "copy_float32_4d_float32_3d_float32_3d"  # Y, Y_h, Y_c
    assert "@outputs_to_host" not in lone.executable.as_text()  # not called by main: the runtime launches it
    assert module_function(lone.executable, OUTPUTS_TO_HOST) is not None  # outputs into page-locked host memory
    assert _outside_the_graph(bounded_stack) == ["copy_float32_3d", "copy_float32_3d"]  # X in, Y out
    assert "transpose" in " ".join(_calls(bounded_stack.executable.as_text(), "main_cuda_graph_capture"))


def test_the_whole_call_writes_given_outputs_into_buffers_planned_once(bounded_stack):
    """WHOLE_CALL (cuda_graph.with_whole_call): main as memory planning left it, its copies and every kernel launched
    from the VM (RewriteCUDAGraph never saw it), taking its outputs after its inputs (the copy out writes them) and its
    planned buffers last, as WHOLE_CALL_BUFFERS makes them (one set a module, whatever signature is captured); nothing
    else allocated here, so it returns nothing to keep."""
    text = bounded_stack.executable.as_text()

    def body(function):
        return text[text.index(f"@{function}:"):].split("\n\n", 1)[0].splitlines()

    def args(line):
        return [a.strip() for a in line.split("in: ")[1].split("dst:")[0].split(",")]

    whole = [c for c in _calls(text, WHOLE_CALL) if not c.startswith("shape_func")]  # (the VM's shape arithmetic)
    assert whole[0] == "copy_float32_3d" and whole[-1] == "copy_float32_3d" and whole.count("rnn_lstm0") == 2
    assert not any("run_or_capture" in line or "alloc_storage" in line for line in body(WHOLE_CALL))
    copy_out = args(next(line for line in reversed(body(WHOLE_CALL)) if "copy_float32_3d" in line))
    assert copy_out[1] == "%1"  # Y straight into the second parameter, the destination after X
    storages = [line for line in body(WHOLE_CALL) if "vm.builtin.tuple_getitem in: %2," in line]  # the buffers, last
    made = [line for line in body(WHOLE_CALL_BUFFERS) if "vm.builtin.alloc_storage" in line]
    assert made and len(storages) == len(made)
    assert args(body(WHOLE_CALL)[-2]) == [""]  # an empty tuple returned: nothing to keep
    cpu = tvmrnn.compile(_row_model(LSTM_BI), target="llvm", logs=False)
    assert f"@{WHOLE_CALL}:" not in cpu.executable.as_text()


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
def test_lone_node_graph_runs_match_the_reference():
    """The lone node through its copies (lengths and states in, all three outputs out), capture and replay, against float64."""
    module = tvmrnn.compile(CASE.model(), target="cuda", max_dims=BOUNDS, cuda_graph=True, logs=False)
    rng = np.random.default_rng(7)
    for T, N in [(12, 5), (40, 17), (12, 5), (3, 1), (40, 17)]:
        feeds = CASE.feeds(rng, T, N)
        ref = CASE.reference(feeds)
        for name, value in module.run(feeds).items():
            np.testing.assert_allclose(value, ref[name], rtol=1e-4, atol=1e-5, err_msg=f"{name} T={T} N={N}")


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


def test_copy_kernel_copies_each_element_to_itself():
    """schedules.device_copy of one tensor or several, at any rank: flat views of each A and B, one thread per element
    of the largest (symbolic) size, B[e] = A[e] under e < its size; the CUDA kernel has no index division."""
    import re

    from schedules.device_copy import device_copy

    target = tvm.target.Target({"kind": "cuda", "arch": "sm_90"})
    for signature in (((1, "int32"),), ((4, "float32"),), ((3, "float32"), (1, "int32"), (2, "float16"))):
        func = device_copy(signature)
        script = func.script()
        for t in range(len(signature)):
            a, b = (re.search(rf"(\w+) = ({name}\.view\(|T\.decl_buffer\(.*data={name}\.data)", script).group(1)
                    for name in (f"A{t}", f"B{t}"))
            assert re.search(rf"if (.+) < (.+):\n\s+{b}\[\1\] = {a}\[\1\]", script), script
        src = tvm.compile(tvm.IRModule({"main": func}), target=target).mod.imports[0].inspect_source()
        body = src[src.index("{", src.index('extern "C" __global__')):]
        assert "__launch_bounds__(256)" in src and "/" not in body and "%" not in body, body


def _static(model, T, N):
    """The model with its inputs' and outputs' seq and batch dims fixed."""
    import onnx

    for tensor in (model.graph.input[0], model.graph.output[0]):
        for dim, size in zip(tensor.type.tensor_type.shape.dim[:2], (T, N)):
            dim.ClearField("dim_param")
            dim.dim_value = size
    onnx.checker.check_model(model)
    return model


def test_static_model_is_captured_without_bounds():
    """No symbolic dims: auto captures one graph (nothing to bound), and cuda_graph=False still turns it off."""
    model = _static(_row_model(LSTM_BI), LSTM_BI.T, LSTM_BI.N)
    module = tvmrnn.compile(model, target="cuda", logs=False)
    assert module.metadata["cuda_graph"].startswith("on: static shapes") and module.metadata["max_dims"] == {}
    assert _calls(module.executable.as_text(), "main_cuda_graph_capture").count("rnn_lstm0") == 2  # one kernel, two layers
    assert tvmrnn.compile(model, target="cuda", cuda_graph=False, logs=False).metadata["cuda_graph"] == "off (cuda_graph=False)"


@pytest.mark.gpu
def test_static_model_graph_runs_match_float64():
    """A static model's one graph: captured at the first run, replayed on fresh inputs, each run against float64."""
    import torch

    row = LSTM_BI
    module = tvmrnn.compile(_static(_row_model(row), row.T, row.N), target="cuda", logs=False)
    assert module.metadata["cuda_graph"].startswith("on: static shapes")
    reference = bench.torch_module(row).double()
    rng = np.random.default_rng(11)
    for _ in range(3):
        x = rng.standard_normal((row.T, row.N, row.I)).astype("float32")
        with torch.no_grad():
            ref = reference(torch.from_numpy(x.astype("float64")))[0].numpy()
        err = np.abs(module.run({"X": x})["Y"] - ref).max() / np.abs(ref).max()
        assert err < 1e-5, f"rel. error {err:.2e}"


@pytest.mark.gpu
def test_whole_call_graphs_keep_their_buffers_from_other_tensors(monkeypatch):
    """run() replays one graph per input signature (graph_replay), at most MAX_GRAPHS of them: shapes cycled past that
    bound recapture and stay right, and device tensors that invoke() returned before are not overwritten by later
    replays (the graph's buffers are its own, not the VM pool's)."""
    import torch

    from tvmrnn import graph_replay

    monkeypatch.setattr(graph_replay, "MAX_GRAPHS", 2)
    row = LSTM_BI
    module = tvmrnn.compile(_row_model(row), target="cuda", max_dims=BOUNDS, logs=False)
    assert module._graphs is not None
    reference = bench.torch_module(row).double()
    rng = np.random.default_rng(3)

    def check(T, N):
        x = rng.standard_normal((T, N, row.I)).astype("float32")
        with torch.no_grad():
            ref = reference(torch.from_numpy(x.astype("float64")))[0].numpy()
        err = np.abs(module.run({"X": x})["Y"] - ref).max() / np.abs(ref).max()
        assert err < 1e-5, f"T={T} N={N}: rel. error {err:.2e}"

    for T, N in [(12, 5), (40, 17), (3, 1)]:
        check(T, N)
    assert sum(g is not None for g in module._graphs._graphs.values()) == 2  # captured, and evicted past the bound
    held_x = rng.standard_normal((40, 17, row.I)).astype("float32")
    held = module.invoke(module.to_device({"X": held_x}))  # the VM's pool hands it whatever a graph would have freed
    expected = held[0].numpy()
    for T, N in [(40, 17), (3, 1), (40, 17), (12, 5)]:
        check(T, N)
    np.testing.assert_array_equal(held[0].numpy(), expected)


@pytest.mark.gpu
def test_first_replay_of_each_shape_waits_for_the_calls_before_it():
    """A capture runs the call once first (loading its kernels), on the default stream, and its buffers go back to the
    pool while it may still run; the replay right after it must wait for it (graph_replay's stream is a blocking one:
    TVM's own streams are not, and a 3-layer wavefront of 400 steps then read buffers the warm-up was still writing).
    The first run of every shape against float64."""
    import torch

    row = bench.Row("graph-long", "GRU", 400, 2, 16, 64, 3)
    module = tvmrnn.compile(_row_model(row), target="cuda", max_dims={"seq": row.T, "batch": row.N}, logs=False)
    assert module._graphs is not None
    reference = bench.torch_module(row).double()
    rng = np.random.default_rng(13)
    for T, N in [(400, 2), (399, 1), (250, 2)]:
        x = rng.standard_normal((T, N, row.I)).astype("float32")
        with torch.no_grad():
            ref = reference(torch.from_numpy(x.astype("float64")))[0].numpy()
        err = np.abs(module.run({"X": x})["Y"] - ref).max() / np.abs(ref).max()
        assert err < 1e-5, f"T={T} N={N}: rel. error {err:.2e} on the first run of the shape"
