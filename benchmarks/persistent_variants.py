"""Persistent-kernel knobs side by side on the GPU (batch 1 rows): staging h in shared memory, warps per block.

    PYTHONPATH=. python3 benchmarks/persistent_variants.py
"""

import dataclasses
import json
import os

import torch

from schedules import recurrent_persistent as rp
from tvmrnn import bench

ROWS = [r for r in bench.ROWS if r.name in ("lat-b1-h1024", "lat-b1-h512-l2")]
VARIANTS = {"default": {}, "stage_h": {"stage_h": True}, "warps4": {"warps": 4}, "warps16": {"warps": 16}}
base = rp.default_config
results = []
for name, knobs in VARIANTS.items():
    rp.default_config = lambda spec, arch, knobs=knobs: dataclasses.replace(base(spec, arch), **knobs)
    for row in ROWS:
        res = bench.bench_gpu_row(row, kernels=("persistent",), repeats=20)
        results.append({"variant": name, "row": row.name, "ms": res["persistent_ms"], "rel_err": res["persistent_rel_err"],
                        "cudnn_ms": res["best_cudnn_ms"]})
        print(results[-1], flush=True)
out = os.environ.get("OUT", "/tmp")
with open(os.path.join(out, "persistent_variants.json"), "w") as f:
    json.dump({"gpu": torch.cuda.get_device_name(0), "results": results}, f, indent=1)
