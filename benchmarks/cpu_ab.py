"""Whole models on the CPU, today's kernel against one variant of it and ONNX Runtime, interleaved in one process.

    PYTHONPATH=. python3 benchmarks/cpu_ab.py layout|launch|half [ROW ...]

layout: the baseline reads R^T instead of panels of 16 units (recurrent_cpu.r_layout).
launch: the baseline launches TVM's thread pool once per phase and step instead of once per sequence (ONE_LAUNCH).
half: ours is the row's model in fp16 (R read in fp16), the baseline the same model in fp32; ONNX Runtime runs fp32.

This VM's timings move by 10-40% between runs (other tenants), so a comparison across runs says
little: each round here times the three side by side (median of 10 runs each) and reports every
round's ratios, then the medians over 8 rounds.
"""

import contextlib
import statistics
import sys
import time

import numpy as np
import onnxruntime as ort

import tvmrnn
from schedules import recurrent_cpu
from tvmrnn import bench


@contextlib.contextmanager
def patched(module, name, value):
    saved = getattr(module, name)
    setattr(module, name, value)
    try:
        yield
    finally:
        setattr(module, name, saved)


VARIANT = sys.argv[1]
BASELINE = {"layout": ("R^T", lambda: patched(recurrent_cpu, "r_layout", lambda spec: "transposed")),
            "launch": ("launch per step", lambda: patched(recurrent_cpu, "ONE_LAUNCH", False)),
            "half": ("fp32 model", contextlib.nullcontext)}[VARIANT]
OURS_DTYPE = "float16" if VARIANT == "half" else "float32"
NAMES = sys.argv[2:] or ["lat-b1-h512-l2", "lat-b1-h1024", "ds2-lstm", "ds2-gru"]


def median_ms(run, x, n=10):
    run(x)
    times = []
    for _ in range(n):
        t0 = time.perf_counter()
        run(x)
        times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times)


for name in NAMES:
    row = next(r for r in bench.ROWS if r.name == name)
    module = bench.torch_module(row)
    model = bench.onnx_model(module, row)
    x = np.random.default_rng(0).standard_normal((row.T, row.N, row.I)).astype("f4")
    ours_x = x.astype(OURS_DTYPE)
    ours = tvmrnn.compile(bench.onnx_model(module, row, OURS_DTYPE), target="llvm")
    label, baseline_built = BASELINE
    with baseline_built():
        baseline = tvmrnn.compile(model, target="llvm")
    tol = 1e-2 if VARIANT == "half" else 1e-6  # else the same sums
    np.testing.assert_allclose(ours.run({"X": ours_x})["Y"].astype("f4"), baseline.run({"X": x})["Y"], rtol=tol, atol=tol)
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    runs = {"ours": lambda x: ours.run({"X": ours_x}), label: lambda x: baseline.run({"X": x}), "ORT": lambda x: sess.run(None, {"X": x})}
    rounds = {k: [] for k in runs}
    n = 10 if row.T * row.N < 1000 else 3
    for _ in range(8):
        for k, run in runs.items():
            rounds[k].append(median_ms(run, x, n))
    med = {k: statistics.median(v) for k, v in rounds.items()}
    print(f"{name}: ours {med['ours']:.2f} ms, {label} {med[label]:.2f} ms, ONNX Runtime {med['ORT']:.2f} ms; "
          f"{label} / ours {med[label] / med['ours']:.2f}, ORT / ours {med['ORT'] / med['ours']:.2f}, "
          f"ORT / {label} {med['ORT'] / med[label]:.2f}", flush=True)
    print(f"  per round {label} / ours: " + " ".join(f"{t / p:.2f}" for t, p in zip(rounds[label], rounds["ours"])))
    print("  per round ORT / ours: " + " ".join(f"{o / p:.2f}" for o, p in zip(rounds["ORT"], rounds["ours"])), flush=True)
