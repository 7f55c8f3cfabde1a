"""One benchmark row's layer (a per-step row too) compiled and run a few times, for Nsight Compute to profile its recurrent kernel.

    ncu -k regex:rnn_ --launch-count 1 --section SpeedOfLight --section WarpStateStats \
        python3 benchmarks/ncu_row.py blog-a float16 [T]

T (default 20) shortens the sequence: each step does the same work, and ncu replays the kernel once per section pass.
"""

import dataclasses
import sys

import numpy as np

import tvmrnn
from tvmrnn import bench

name, dtype = sys.argv[1], sys.argv[2]
row = dataclasses.replace(next(r for r in bench.ROWS + bench.STEP_ROWS if r.name == name), T=int(sys.argv[3]) if len(sys.argv) > 3 else 20)
module = tvmrnn.compile(bench.onnx_model(bench.torch_module(row), row, dtype), target="cuda", cuda_graph=False, logs=False)
x = np.random.default_rng(0).standard_normal((row.T, row.N, row.I)).astype(dtype)
for _ in range(2):
    out = module.run({"X": x})
print(row, {k: v.shape for k, v in out.items()}, module.metadata["layers"][0].get("kernel"))
