"""The recurrent kernels' generated CUDA for every bench row's layers (both dtypes, default plans, sm_90a), hashed: run
at two commits and compare, to show which rows a change touched (no GPU needed; CUDA source through NVRTC's build path).

    PYTHONPATH=<checkout> python3 benchmarks/kernel_hashes.py OUT.json
"""

import hashlib
import json
import sys

import tvm

from schedules import cooperative, recurrent_kernel
from schedules.cells import cell_for
from tvmrnn import bench
from tvmrnn.frontend.inspect import find_rnn_layers

TARGET = tvm.target.Target({"kind": "cuda", "arch": "sm_90a"})


def source_hash(spec) -> str:
    kernel = recurrent_kernel(spec, cell_for(spec), TARGET)
    source = tvm.tirx.build(kernel.func, target=TARGET, pipeline=cooperative.register()).imports[0].inspect_source()
    return hashlib.sha256(source.encode()).hexdigest()[:12]


hashes = {}
for row in bench.ROWS:
    for dtype in ("float32", "float16"):
        specs = {layer.spec for layer in find_rnn_layers(bench.onnx_model(bench.torch_module(row), row, dtype))}
        hashes[f"{row.name}/{dtype}"] = [source_hash(spec) for spec in sorted(specs, key=repr)]
        print(row.name, dtype, hashes[f"{row.name}/{dtype}"], flush=True)
with open(sys.argv[1], "w") as f:
    json.dump(hashes, f, indent=1)
