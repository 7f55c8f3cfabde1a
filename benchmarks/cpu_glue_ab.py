"""CPU rows with the exporter's glue after the last layer folded into the kernel's Y (tvmrnn.frontend.outputs) against
the glue run as TVM builds it (a copy kernel), checked against ONNX Runtime and timed in alternating rounds.

    PYTHONPATH=. python3 benchmarks/cpu_glue_ab.py [ROW ...]     (default: the CPU table's rows)   -> $OUT/cpu_glue_ab.json
"""

import json
import os
import statistics
import sys
import time

import numpy as np
import onnxruntime as ort

import tvmrnn
from tvmrnn import bench
from tvmrnn.frontend import outputs

NAMES = sys.argv[1:] or ["ds2-lstm", "ds2-gru", "lat-b1-h512-l2"]
ROUNDS, RUNS = 7, 3
results = []
for name in NAMES:
    row = next(r for r in bench.ROWS if r.name == name)
    model = bench.onnx_model(bench.torch_module(row), row, "float32")
    x = np.random.default_rng(0).standard_normal((row.T, row.N, row.I)).astype("float32")
    ref = ort.InferenceSession(model.SerializeToString()).run(None, {"X": x})[0]
    modules = {}
    for fold in (False, True):
        outputs.FOLD = fold
        modules["folded" if fold else "glue kernel"] = tvmrnn.compile(model, target="llvm", logs=False)
    outputs.FOLD = True
    result = {"row": name}
    for k, m in modules.items():
        y = m.run({"X": x})["Y"]
        result[f"{k} rel_err"] = float(np.abs(y - ref).max() / np.abs(ref).max())
        result[f"{k} y_squeezed"] = m.metadata["layers"][-1]["y_squeezed"]
    dev = next(iter(modules.values())).to_device({"X": x})
    times = {k: [] for k in modules}
    for _ in range(ROUNDS):
        for k, m in modules.items():
            m.invoke(dev)  # this round's warm-up
            start = time.perf_counter()
            for _ in range(RUNS):
                m.invoke(dev)
            times[k].append((time.perf_counter() - start) / RUNS * 1e3)
    for k in modules:
        result[f"{k} ms"] = statistics.median(times[k])
    print(json.dumps(result), flush=True)
    results.append(result)
out = os.environ.get("OUT", "/tmp/out")
os.makedirs(out, exist_ok=True)
with open(os.path.join(out, "cpu_glue_ab.json"), "w") as f:
    json.dump(results, f, indent=1)
