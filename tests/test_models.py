"""Every model in models/ compiles and matches ONNX Runtime on the CPU, and compiles and exports for CUDA (no GPU needed);
models exported from torch.nn.LSTM/GRU match PyTorch."""

from __future__ import annotations

import importlib.util
import os

import numpy as np
import onnx
import onnxruntime as ort
import pytest

import tvmrnn

MODELS = os.path.join(os.path.dirname(__file__), "..", "models")


def _zoo():
    spec = importlib.util.spec_from_file_location("build_zoo", os.path.join(MODELS, "build_zoo.py"))
    zoo = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(zoo)
    return zoo


ZOO = _zoo()
ENTRIES = [pytest.param(m, id=m.name) for m in ZOO.ZOO]


def ort_reference(model_path, feeds):
    model = onnx.load(model_path)
    if any(a.name == "layout" and a.i == 1 for n in model.graph.node for a in n.attribute):
        model = ZOO.to_layout0(model)  # ONNX Runtime refuses layout 1: run the transposed twin
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return dict(zip([o.name for o in sess.get_outputs()], sess.run(None, feeds)))


@pytest.mark.parametrize("entry", ENTRIES)
def test_zoo_model_matches_onnxruntime(entry):
    path = os.path.join(MODELS, entry.filename)
    module = tvmrnn.compile(path, target="llvm")
    assert len(module.metadata["layers"]) == len(entry.rnn_ops)
    for batch, time in ((2, 16), (3, 5), (1, 1)):
        feeds = ZOO.example_inputs(entry.name, batch=batch, time=time, seed=batch)
        ours, ref = module.run(feeds), ort_reference(path, feeds)
        assert set(ours) == set(ref)
        for name in ref:
            np.testing.assert_allclose(ours[name], ref[name], rtol=1e-4, atol=1e-5, err_msg=f"{entry.name}: {name} at batch {batch} time {time}")


@pytest.mark.parametrize("target", ["nvidia/nvidia-h100", pytest.param("nvidia/nvidia-a100", marks=pytest.mark.slow)])
@pytest.mark.parametrize("entry", ENTRIES)
def test_zoo_model_compiles_for_cuda_and_exports(entry, target, tmp_path):
    module = tvmrnn.compile(os.path.join(MODELS, entry.filename), target=target)
    path = module.export(tmp_path / f"{entry.name}.so")
    assert os.path.getsize(path) > 0
    meta = tvmrnn.runtime.metadata_path(path)
    import json

    with open(meta) as f:
        info = json.load(f)
    assert info["target_kind"] == "cuda" and len(info["layers"]) == len(entry.rnn_ops)
    assert all(layer["kernel"].startswith("cuda: ") for layer in info["layers"])


# one CUDA build (NVRTC) per case, tens of seconds each: the default run builds float16; exact fp32 is built by the
# export test above; bfloat16, tf32 and the exact fp32 tensor-core branches run with the slow ones
@pytest.mark.parametrize("options", [{"dtype": "float16"}, pytest.param({"dtype": "bfloat16"}, marks=pytest.mark.slow),
                                     pytest.param({"precision": "tf32"}, marks=pytest.mark.slow),
                                     pytest.param({}, marks=pytest.mark.slow)],
                         ids=lambda o: str(*o.values()) or "exact")
@pytest.mark.parametrize("entry", ENTRIES)
def test_zoo_model_builds_tensor_core_kernels(entry, options):
    """Half storage, TF32 and exact fp32 (3xTF32) build for CUDA without a GPU (NVRTC), every layer's large-batch
    branches on tensor-core kernels (the zoo's layers all fit in shared memory: the persistent one, up to batch 32
    where at most EXACT_MMA_MAX_HIDDEN units (in a rounding mode: below ROUNDED_PASSES_MIN_HIDDEN, or not an LSTM) have the
    per-step one above)."""
    from schedules.choice import EXACT_MMA_MAX_HIDDEN, ROUNDED_PASSES_MIN_HIDDEN

    module = tvmrnn.compile(os.path.join(MODELS, entry.filename), target="nvidia/nvidia-h100", logs=False, **options)
    for layer in module.metadata["layers"]:
        kinds = [branch["config"]["kind"] for branch in layer["schedule"]]
        per_step_above = (layer["hidden_size"] < ROUNDED_PASSES_MIN_HIDDEN or layer["op"] != "LSTM") if options else \
            layer["hidden_size"] <= EXACT_MMA_MAX_HIDDEN
        assert kinds[-2:] == (["persistent_mma", "mma"] if per_step_above else ["persistent_mma", "persistent_mma"]), layer["kernel"]
        assert layer["dtype"] == options.get("dtype", "float32") and layer["precision"] == options.get("precision", "exact")


@pytest.mark.parametrize("cell", ["LSTM", "GRU"])
def test_torch_export_matches_pytorch(cell, tmp_path):
    torch = pytest.importorskip("torch")
    torch.manual_seed(0)
    net = getattr(torch.nn, cell)(12, 20, num_layers=2, bidirectional=True).eval()
    x = torch.randn(7, 3, 12)
    path = str(tmp_path / "m.onnx")
    torch.onnx.export(net, (x,), path, input_names=["x"], output_names=["y", "h"] + (["c"] if cell == "LSTM" else []),
                      dynamic_axes={"x": {0: "time", 1: "batch"}}, opset_version=17, dynamo=False)
    module = tvmrnn.compile(path, target="llvm")
    for T, N in ((7, 3), (11, 2)):
        xs = torch.randn(T, N, 12)
        with torch.no_grad():
            want = net(xs)
        ours = module.run({"x": xs.numpy()})
        np.testing.assert_allclose(ours["y"], want[0].numpy(), rtol=1e-4, atol=1e-5)
        states = want[1] if cell == "GRU" else want[1][0]
        np.testing.assert_allclose(ours["h"], states.numpy(), rtol=1e-4, atol=1e-5)
