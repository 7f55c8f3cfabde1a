"""Shared by the A/B benchmarks: whole models built in two or more variants, checked against float64 PyTorch on the CPU,
then timed in alternating rounds in one process (so clock drift and a neighbour's load fall on every variant alike).

    results = compare(rows, {"name": build(row, model) -> module, ...}, dtypes)    -> list of dicts, also printed
    build = built_with(module, NAME=value, ...)   compile for CUDA with a module's constants set, restored after
"""

import json
import os
import statistics

import numpy as np
import torch

import tvmrnn
from tvmrnn import bench

ROUNDS, RUNS = 7, 10


def built_with(module, **overrides):
    """A build for compare: tvmrnn.compile for CUDA with the module's constants (the defaults the schedules read when a
    layer's kernels are picked and built) set to `overrides`, and put back after."""
    def make(row, model):
        before = {name: getattr(module, name) for name in overrides}
        for name, value in overrides.items():
            setattr(module, name, value)
        try:
            return tvmrnn.compile(model, target="cuda")
        finally:
            for name, value in before.items():
                setattr(module, name, value)
    return make


def timed(module, x, runs=RUNS) -> float:
    start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(runs):
        module.invoke(x)
    stop.record()
    stop.synchronize()
    return start.elapsed_time(stop) / runs


def rel(y, ref) -> float:
    return float(np.abs(np.asarray(y, "float64") - ref).max() / np.abs(ref).max())


def compare(names, variants: dict, dtypes=("float32",), describe=lambda m: m.metadata["layers"][-1]["kernel"]) -> list[dict]:
    results = []
    for name in names:
        row = next(r for r in bench.ROWS if r.name == name)
        for dtype in dtypes:
            model = bench.onnx_model(bench.torch_module(row), row, dtype)
            x = np.random.default_rng(0).standard_normal((row.T, row.N, row.I)).astype(dtype)
            with torch.no_grad():
                ref = bench.torch_module(row).double()(torch.from_numpy(x.astype("float64")))[0].numpy()
            modules = {k: build(row, model) for k, build in variants.items()}
            first = next(iter(modules.values()))
            result = {"row": name, "dtype": dtype, "kernel": describe(first)}
            dev = first.to_device({"X": x})
            for k, m in modules.items():
                result[f"{k} rel_err"] = rel(m.run({"X": x})["Y"], ref)
                timed(m, dev)
            times = {k: [] for k in modules}
            for _ in range(ROUNDS):
                for k, m in modules.items():
                    times[k].append(timed(m, dev))
            for k in modules:
                result[f"{k} ms"] = statistics.median(times[k])
            print(json.dumps(result), flush=True)
            results.append(result)
    return results


def write(results, filename):
    out = os.environ.get("OUT", "/tmp/out")
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, filename), "w") as f:
        json.dump(results, f, indent=1)
