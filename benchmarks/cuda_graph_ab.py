"""Whole models with and without a CUDA graph (tvmrnn.cuda_graph), timed interleaved in one process.

    PYTHONPATH=. python3 benchmarks/cuda_graph_ab.py [ROW ...]    (default: the rows below)

Each row and dtype is compiled twice with its tuned defaults (compile's logs): cuda_graph=False, and bounded to the row's
shape (max_dims seq=T, batch=N) with the graph on. Both outputs are checked against float64 PyTorch on the CPU, and the
graph's against the plain module's; a second, shorter sequence (a new capture) is checked too. Then rounds of 20 runs
alternate between the two, so clock drift falls on both alike. Writes $OUT/cuda_graph_ab.json.
"""

import json
import os
import statistics
import sys

import numpy as np
import torch

import tvmrnn
from ab import rel, timed
from tvmrnn import bench

NAMES = sys.argv[1:] or ["blog-b", "b64-h1024-l2", "lat-b1-h512-l2", "b8-h1024-l2", "ds2-lstm"]
ROUNDS, RUNS = 7, 20

results = []
for name in NAMES:
    row = next(r for r in bench.ROWS if r.name == name)
    reference = bench.torch_module(row).double()
    for dtype in ("float32", "float16"):
        model = bench.onnx_model(bench.torch_module(row), row, dtype)
        modules = {"no graph": tvmrnn.compile(model, target="cuda", cuda_graph=False),
                   "graph": tvmrnn.compile(model, target="cuda", max_dims={"seq": row.T, "batch": row.N}, cuda_graph=True)}
        result = {"row": name, "dtype": dtype, "graph_note": modules["graph"].metadata["cuda_graph"]}
        for T in (row.T, row.T // 2 + 1):  # the second length is a second capture
            x = np.random.default_rng(T).standard_normal((T, row.N, row.I)).astype(dtype)
            with torch.no_grad():
                ref = reference(torch.from_numpy(x.astype("float64")))[0].numpy()
            outs = {k: m.run({"X": x})["Y"] for k, m in modules.items()}
            again = modules["graph"].run({"X": x})["Y"]  # the replay of the graph just captured
            result[f"T{T}"] = {**{f"{k} rel_err": rel(v, ref) for k, v in outs.items()},
                               "graph vs no graph": rel(outs["graph"], outs["no graph"].astype("float64")),
                               "replay vs capture": rel(again, outs["graph"].astype("float64"))}
        x = modules["graph"].to_device({"X": np.random.default_rng(1).standard_normal((row.T, row.N, row.I)).astype(dtype)})
        times = {k: [] for k in modules}
        for k, m in modules.items():
            timed(m, x, RUNS)  # warm-up (the graph's capture for this shape happened above)
        for _ in range(ROUNDS):
            for k, m in modules.items():
                times[k].append(timed(m, x, RUNS))
        for k in modules:
            result[f"{k} ms"] = statistics.median(times[k])
        result["graph speed-up"] = result["no graph ms"] / result["graph ms"]
        print(json.dumps(result), flush=True)
        results.append(result)

out = os.environ.get("OUT", "/tmp/out")
os.makedirs(out, exist_ok=True)
with open(os.path.join(out, "cuda_graph_ab.json"), "w") as f:
    json.dump(results, f, indent=1)
