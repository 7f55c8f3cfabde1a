"""Whole models on the CPU with R in panels against R^T, and ONNX Runtime, interleaved in one process.

    PYTHONPATH=. python3 benchmarks/cpu_layout_ab.py [ROW ...]

This VM's timings move by 10-40% between runs (other tenants), so a comparison across runs says
little: each round here times the three side by side (median of 10 runs each) and reports every
round's ratios, then the medians over 8 rounds.
"""

import statistics
import sys
import time

import numpy as np
import onnxruntime as ort

import tvmrnn
from schedules import recurrent_cpu
from tvmrnn import bench

NAMES = sys.argv[1:] or ["lat-b1-h512-l2", "lat-b1-h1024", "ds2-lstm", "ds2-gru"]
panels_rule = recurrent_cpu.r_layout


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
    model = bench.onnx_model(bench.torch_module(row), row)
    x = np.random.default_rng(0).standard_normal((row.T, row.N, row.I)).astype("f4")
    panels = tvmrnn.compile(model, target="llvm")
    recurrent_cpu.r_layout = lambda spec: "transposed"
    try:
        transposed = tvmrnn.compile(model, target="llvm")
    finally:
        recurrent_cpu.r_layout = panels_rule
    np.testing.assert_allclose(panels.run({"X": x})["Y"], transposed.run({"X": x})["Y"], rtol=1e-6, atol=1e-7)  # same sums
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    runs = {"panels": lambda x: panels.run({"X": x}), "R^T": lambda x: transposed.run({"X": x}),
            "ORT": lambda x: sess.run(None, {"X": x})}
    rounds = {k: [] for k in runs}
    n = 10 if row.T * row.N < 1000 else 3
    for _ in range(8):
        for k, run in runs.items():
            rounds[k].append(median_ms(run, x, n))
    med = {k: statistics.median(v) for k, v in rounds.items()}
    print(f"{name}: panels {med['panels']:.2f} ms, R^T {med['R^T']:.2f} ms, ONNX Runtime {med['ORT']:.2f} ms; "
          f"R^T / panels {med['R^T'] / med['panels']:.2f}, ORT / panels {med['ORT'] / med['panels']:.2f}, "
          f"ORT / R^T {med['ORT'] / med['R^T']:.2f}", flush=True)
    print("  per round R^T / panels: " + " ".join(f"{t / p:.2f}" for t, p in zip(rounds["R^T"], rounds["panels"])))
    print("  per round ORT / panels: " + " ".join(f"{o / p:.2f}" for o, p in zip(rounds["ORT"], rounds["panels"])), flush=True)
