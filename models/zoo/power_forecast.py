"""A load forecaster (PyPI device-power-forecast-mcp 0.1.3, an ONNX file and its scaler in the wheel): a 2-layer
bidirectional LSTM of 192 over a day of 5-minute steps (288 x 21 standardized features: 17 electrical measurements of
a device and 4 time-of-day/day-of-week features) and a dense head giving the next day's 288 power values. The package
runs the shipped file (torch 2.12's dynamo exporter, weights as external data) in ONNX Runtime, one day at a time.

Two zoo entries: the shipped file as it is, and the same weights in torch's nn.LSTM exported by the legacy exporter
(checked against ONNX Runtime on the shipped file before it is exported).
"""

from __future__ import annotations

import shutil

import numpy as np

from .fetch import cached_onnx, package_dir

PACKAGE, VERSION = "device-power-forecast-mcp", "0.1.3"
STEM = "wgt_energy_device_power_118600010222"
STEPS, FEATURES, HIDDEN = 288, 21, 192


def _shipped():
    return package_dir(PACKAGE, VERSION) / "device_power_forecast_mcp" / "model_pth"


def build_shipped():
    """The shipped ONNX file in the zoo's cache, beside it its external weights file under the name it refers to and
    the scaler (the feeds need it)."""
    def copy(path):
        for name in (f"{STEM}_model.onnx.data", f"{STEM}_scaler.npz"):
            shutil.copyfile(_shipped() / name, path.parent / name)
        shutil.copyfile(_shipped() / f"{STEM}_model.onnx", path)

    return cached_onnx("power_forecast", copy)


def _torch_gates(w):
    """ONNX LSTM gate blocks (i, o, f, c) -> torch's (i, f, c, o), along axis 0."""
    i, o, f, c = np.split(w, 4)
    return np.concatenate([i, f, c, o])


def lstm_state_dict(onnx_path) -> dict:
    """The shipped graph's weights as nn.LSTM(21, 192, 2, bidirectional) + Linear(384, 288) names: the initializers
    keep torch's names and layout, except the biases, which the exporter folded into each LSTM node's B input
    ([direction, input bias + recurrent bias], ONNX's gate order)."""
    import onnx
    from onnx import numpy_helper

    graph = onnx.load(str(onnx_path)).graph
    tensors = {t.name: numpy_helper.to_array(t) for t in graph.initializer}
    weights = {k: v for k, v in tensors.items() if k.startswith(("lstm.", "fc."))}
    for layer, node in enumerate(n for n in graph.node if n.op_type == "LSTM"):
        for d, suffix in enumerate(("", "_reverse")):
            bias = tensors[node.input[3]][d]
            weights[f"lstm.bias_ih_l{layer}{suffix}"] = _torch_gates(bias[: 4 * HIDDEN])
            weights[f"lstm.bias_hh_l{layer}{suffix}"] = _torch_gates(bias[4 * HIDDEN:])
    return weights


def forecaster(onnx_path):
    import torch
    from torch import nn

    class Forecaster(nn.Module):
        def __init__(self):
            super().__init__()
            self.lstm = nn.LSTM(FEATURES, HIDDEN, 2, batch_first=True, bidirectional=True)
            self.fc = nn.Linear(2 * HIDDEN, STEPS)

        def forward(self, x):
            out, _ = self.lstm(x)
            return self.fc(out[:, -1])

    model = Forecaster()
    model.load_state_dict({k: torch.from_numpy(np.array(v)) for k, v in lstm_state_dict(onnx_path).items()})
    return model.eval()


def torch_module():
    """The shipped weights in torch (the module both entries run)."""
    return forecaster(build_shipped())


def check(model, onnx_path, x):
    """The torch rebuild against the package's own inference (ONNX Runtime on the shipped file)."""
    import onnxruntime as ort
    import torch

    want = ort.InferenceSession(str(onnx_path), providers=["CPUExecutionProvider"]).run(None, {"input": x})[0]
    with torch.no_grad():
        ours = model(torch.from_numpy(x)).numpy()
    np.testing.assert_allclose(ours, want, rtol=1e-4, atol=1e-4, err_msg="torch rebuild vs the shipped ONNX file")


def build_legacy():
    import torch

    from .export import export

    def make(path):
        shipped = build_shipped()
        model = forecaster(shipped)
        check(model, shipped, feeds(np.random.default_rng(1))[0]["input"])
        export(model, (torch.rand(2, STEPS, FEATURES),), path, "legacy", ["input"], ["output"], {"input": {0: "batch"}})

    return cached_onnx("power_forecast_legacy", make)


def _day(rng) -> np.ndarray:
    """A day of raw measurements [288, 21] in the package's column order: power p with a daytime load cycle, the phase
    currents a and c following it, line voltages a and c near 10.4 kV, the power factor, the time features (the other
    columns are zero in the package's training data: its scaler's mean and scale are 0 and 1 there)."""
    hours = (np.arange(STEPS) * 5 / 60 + rng.uniform(0, 24)) % 24
    day = rng.integers(0, 7)
    load = 0.5 + 0.5 * np.clip(np.sin((hours - 6) / 12 * np.pi), 0, None) + 0.05 * rng.standard_normal(STEPS)
    raw = np.zeros((STEPS, FEATURES))
    raw[:, 0] = 6600 * load
    raw[:, 1], raw[:, 3] = 37 * load, 36.5 * load
    raw[:, 5], raw[:, 7] = 10460 + rng.normal(0, 150, (2, STEPS))
    raw[:, 13] = np.clip(0.7 + 0.2 * load + 0.05 * rng.standard_normal(STEPS), 0, 1)
    hour, weekday = 2 * np.pi * hours / 24, np.full(STEPS, 2 * np.pi * day / 7)
    raw[:, 17:] = np.stack([np.sin(hour), np.cos(hour), np.sin(weekday), np.cos(weekday)], 1)
    return raw


def feeds(rng):
    """A device's day, standardized with the shipped scaler as the package does: [1, 288, 21] (the shipped file
    declares its output's batch as 1)."""
    scaler = np.load(build_shipped().parent / f"{STEM}_scaler.npz")
    x = (_day(rng)[None] - scaler["mean"]) / scaler["scale"]
    return [{"input": x.astype(np.float32)}]
