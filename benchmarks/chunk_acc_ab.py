"""Exact fp32's recurrent 3xTF32 kernels with and without per-chunk fp32 accumulation (chunk_acc), timed interleaved.

    PYTHONPATH=. python3 benchmarks/chunk_acc_ab.py [ROW ...]    (default: the fp32 rows whose recurrence is 3xTF32)

Session 9 gave the recurrent mma and persistent_mma kernels chunk_acc (recurrent_mma.CHUNK_ACC_MAX_ACCUMULATORS) along
with accurate sigmoid/tanh in exact-fp32 epilogues; on the H100 the fp32 rows' error then fell from 1.0-1.15e-5 to
0.6-3.1e-6 and ds2-5l-bi slowed from 31.0 to 33.6 ms. lat-b1-h1024, whose recurrence is SIMT, fell from 1.09e-5 to
4.5e-7 with the epilogue change alone. This builds each row with the threshold at 0 (no chunk_acc) and at its default,
checks both against float64 PyTorch on the CPU, and times them in alternating rounds (bounded modules, CUDA graph on).
Writes $OUT/chunk_acc_ab.json.
"""

import json
import os
import statistics
import sys

import numpy as np
import torch

import tvmrnn
from schedules import recurrent_mma
from tvmrnn import bench

NAMES = sys.argv[1:] or ["ds2-5l-bi", "ds2-lstm", "ds2-gru", "b8-h1024-l2", "b64-h1024-l2", "blog-b"]
ROUNDS, RUNS = 7, 10
DEFAULT = recurrent_mma.CHUNK_ACC_MAX_ACCUMULATORS


def build(row, model, limit):
    recurrent_mma.CHUNK_ACC_MAX_ACCUMULATORS = limit
    try:
        return tvmrnn.compile(model, target="cuda", max_dims={"seq": row.T, "batch": row.N})
    finally:
        recurrent_mma.CHUNK_ACC_MAX_ACCUMULATORS = DEFAULT


def timed(module, x) -> float:
    start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(RUNS):
        module.invoke(x)
    stop.record()
    stop.synchronize()
    return start.elapsed_time(stop) / RUNS


results = []
for name in NAMES:
    row = next(r for r in bench.ROWS if r.name == name)
    model = bench.onnx_model(bench.torch_module(row), row)
    x = np.random.default_rng(0).standard_normal((row.T, row.N, row.I)).astype("float32")
    with torch.no_grad():
        ref = bench.torch_module(row).double()(torch.from_numpy(x.astype("float64")))[0].numpy()
    modules = {"one accumulator": build(row, model, 0), "chunk_acc": build(row, model, DEFAULT)}
    result = {"row": name, "kernel": modules["chunk_acc"].metadata["layers"][-1]["kernel"]}
    dev = modules["chunk_acc"].to_device({"X": x})
    for k, m in modules.items():
        y = m.run({"X": x})["Y"].astype("float64")
        result[f"{k} rel_err"] = float(np.abs(y - ref).max() / np.abs(ref).max())
        timed(m, dev)
    times = {k: [] for k in modules}
    for _ in range(ROUNDS):
        for k, m in modules.items():
            times[k].append(timed(m, dev))
    for k in modules:
        result[f"{k} ms"] = statistics.median(times[k])
    result["chunk_acc cost"] = result["chunk_acc ms"] / result["one accumulator ms"]
    print(json.dumps(result), flush=True)
    results.append(result)

out = os.environ.get("OUT", "/tmp/out")
os.makedirs(out, exist_ok=True)
with open(os.path.join(out, "chunk_acc_ab.json"), "w") as f:
    json.dump(results, f, indent=1)
