"""Tiled-kernel points side by side with the stepwise kernel and cuDNN on the batch-8..64 rows, and where a step's time goes.

    PYTHONPATH=. python3 benchmarks/tiled_variants.py [ROW ...]

For each row and dtype: cuDNN once, the stepwise default, then each tiled point (units, row_threads,
rows_per_thread, k_chunk); every result checked against cuDNN's output. Then a CUDA-kernel profile
(torch.profiler) of the tiled default: the projection GEMM against the recurrent launches.
"""

import json
import os
import sys

import torch

import tvmrnn
from schedules import recurrent_tiled as rt
from tvmrnn import bench

NAMES = sys.argv[1:] or ["b64-h1024-l2", "b8-h1024-l2", "blog-a", "ds2-lstm"]
ROWS = [next(r for r in bench.ROWS if r.name == name) for name in NAMES]
POINTS = [(8, 16, 4, 32), (8, 16, 2, 32), (4, 16, 2, 32), (16, 16, 2, 32), (8, 8, 2, 32), (8, 16, 1, 32)]
base = rt.default_config
out = os.environ.get("OUT", "/tmp")
results = []


def keep(res, **extra):
    res = {k: v for k, v in res.items() if not k.startswith("_")}
    res.update(extra)
    results.append(res)
    print({k: (round(v, 4) if isinstance(v, float) else v) for k, v in res.items() if k.endswith(("_ms", "err", "point"))}, flush=True)
    with open(os.path.join(out, "tiled_variants.json"), "w") as f:
        json.dump({"gpu": torch.cuda.get_device_name(0), "results": results}, f, indent=1)


for row in ROWS:
    for dtype in ("float32", "float16"):
        first = bench.bench_gpu_row(row, kernels=("stepwise",), repeats=10, warmup=3, dtype=dtype)
        keep(first, point="stepwise default")
        for units, rg, tb, kc in POINTS:
            rt.default_config = lambda batch=None, p=(units, rg, tb, kc): rt.TiledConfig(*p)
            res = bench.bench_gpu_row(row, kernels=("tiled",), repeats=10, warmup=3, dtype=dtype, cudnn=first)
            keep(res, point=f"tiled u{units} rt{rg} tb{tb} kc{kc}")
        rt.default_config = base
        if row.name in ("b64-h1024-l2", "blog-a") and dtype == "float32":
            model = bench.onnx_model(bench.torch_module(row), row, dtype)
            compiled = tvmrnn.compile(model, target="cuda", kernel="tiled", logs=False)
            x = compiled.to_device({"X": torch.randn(row.T, row.N, row.I).numpy().astype(dtype)})
            compiled.invoke(x)
            torch.cuda.synchronize()
            with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
                compiled.invoke(x)
                torch.cuda.synchronize()
            table = prof.key_averages().table(sort_by="cuda_time_total", row_limit=8)
            print(f"profile {row.name} {dtype}\n{table}", flush=True)
            with open(os.path.join(out, f"profile-{row.name}-{dtype}.txt"), "w") as f:
                f.write(table)
