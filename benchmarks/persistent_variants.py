"""Persistent-kernel knobs side by side on the GPU (the batch-1 rows), timed interleaved in one process.

    PYTHONPATH=. python3 benchmarks/persistent_variants.py [VARIANT ...]    (default: every variant below)

Each variant's whole-model module is built once per row and dtype (the persistent kernel's default point with the
variant's knobs); then rounds of 20 runs each go to every variant in turn, so drift of the GPU's clocks or of a
neighbour's load falls on all of them alike. Every variant's output is checked against PyTorch (float64 on the CPU)
first. Writes $OUT/persistent_variants.json.
"""

import dataclasses
import json
import os
import statistics
import sys

import numpy as np
import torch

import tvmrnn
from ab import timed
from schedules import recurrent_persistent as rp
from tvmrnn import bench

ROWS = [r for r in bench.ROWS if r.name in ("lat-b1-h512-l2", "lat-b1-h1024")]
# each sets both h-staging and prefetch (whatever the default does with them), the rest of the default point kept
VARIANTS = {"plain": {"stage_h": False, "prefetch": 0}, "prefetch": {"stage_h": False, "prefetch": 1},
            "stage_h": {"stage_h": True, "prefetch": 0}, "stage_h+prefetch": {"stage_h": True, "prefetch": 1},
            "stage_h+prefetch+warps4": {"stage_h": True, "prefetch": 1, "warps": 4}}
NAMES = sys.argv[1:] or list(VARIANTS)
ROUNDS, RUNS = 7, 20
base = rp.default_config


def build(row, dtype, knobs):
    rp.default_config = lambda spec, arch: dataclasses.replace(base(spec, arch), **knobs)
    try:
        return tvmrnn.compile(bench.onnx_model(bench.torch_module(row), row, dtype), target="cuda", kernel="persistent", logs=False)
    finally:
        rp.default_config = base


results = []
for row in ROWS:
    torch_mod = bench.torch_module(row).double()
    for dtype in ("float32", "float16"):
        x = np.random.default_rng(0).standard_normal((row.T, row.N, row.I)).astype(dtype)
        with torch.no_grad():
            ref = torch_mod(torch.from_numpy(x.astype("float64")))[0].numpy()
        modules = {name: build(row, dtype, VARIANTS[name]) for name in NAMES}
        times = {name: [] for name in NAMES}
        errs = {}
        for name, m in modules.items():
            errs[name] = bench._rel_err(m.run({"X": x})["Y"].reshape(ref.shape), ref)
        dev_x = {name: m.to_device({"X": x}) for name, m in modules.items()}
        for name, m in modules.items():
            timed(m, dev_x[name], RUNS)  # warm-up
        for _ in range(ROUNDS):
            for name, m in modules.items():
                times[name].append(timed(m, dev_x[name], RUNS))
        for name in NAMES:
            ms = statistics.median(times[name])
            res = {"row": row.name, "dtype": dtype, "variant": name, "knobs": VARIANTS[name], "ms": ms,
                   "us_per_step_layer": ms * 1e3 / (row.T * row.layers), "rel_err": errs[name], "rounds_ms": times[name]}
            results.append(res)
            print(f"{row.name:16s} {dtype:8s} {name:26s} {ms:.4f} ms  {res['us_per_step_layer']:.2f} us/step/layer  "
                  f"rel err {errs[name]:.2e}", flush=True)
out = os.environ.get("OUT", "/tmp")
with open(os.path.join(out, "persistent_variants.json"), "w") as f:
    json.dump({"gpu": torch.cuda.get_device_name(0), "rounds": ROUNDS, "runs_per_round": RUNS, "results": results}, f, indent=1)
