"""Where a compiled row's time goes on the GPU: its kernels (torch.profiler, CUPTI) against the wall time of one run.

    python3 benchmarks/profile_rows.py [ROW ...]      (default: every benchmark row; DTYPES=float16 to filter)

For each row and dtype, the untuned default module: the median wall time of 20 runs (CUDA events), the GPU time
of its kernels in one profiled run, and their difference (time the GPU sits idle between launches: what a CUDA
graph could save), then each kernel kind with its count and time. Writes $OUT/profile_rows.json.
"""

import json
import os
import sys
from collections import defaultdict

import torch

import tvmrnn
from tvmrnn import bench

NAMES = sys.argv[1:] or [r.name for r in bench.ROWS]
DTYPES = os.environ.get("DTYPES", "float32,float16").split(",")
OUT = os.environ.get("OUT", "/tmp")


def kernel_kind(name: str) -> str:
    # TVM names a kernel <function>_kernel[_N]; keep the function
    return name.split("(")[0].replace("_kernel", "")[:60]


def profile(row, dtype) -> dict:
    model = bench.onnx_model(bench.torch_module(row), row, dtype)
    compiled = tvmrnn.compile(model, target="cuda", logs=False)
    x = compiled.to_device({"X": torch.randn(row.T, row.N, row.I).numpy().astype(dtype)})
    wall = bench._median_ms(compiled.invoke, [x], 20, 5, torch.cuda.synchronize,
                            lambda: (torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)))
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        compiled.invoke(x)
        torch.cuda.synchronize()
    kinds = defaultdict(lambda: [0, 0.0])
    for e in prof.events():
        if e.device_type == torch.autograd.DeviceType.CUDA:
            k = kinds[kernel_kind(e.name)]
            k[0] += 1
            k[1] += e.device_time_total / 1e3
    busy = sum(t for _, t in kinds.values())
    launches = sum(n for n, _ in kinds.values())
    res = {"row": row.name, "dtype": dtype, "wall_ms": wall, "kernel_ms": busy, "idle_ms": wall - busy, "launches": launches,
           "kernels": {k: {"count": n, "ms": t} for k, (n, t) in sorted(kinds.items(), key=lambda kv: -kv[1][1])}}
    print(f"{row.name} {dtype}: wall {wall:.3f} ms, kernels {busy:.3f} ms in {launches} launches, idle {wall - busy:.3f} ms "
          f"({(wall - busy) / max(launches, 1) * 1e3:.2f} us per launch)", flush=True)
    for k, v in res["kernels"].items():
        print(f"    {v['count']:5d} x {k:60s} {v['ms']:.3f} ms", flush=True)
    return res


results = [profile(next(r for r in bench.ROWS if r.name == n), d) for n in NAMES for d in DTYPES]
with open(os.path.join(OUT, "profile_rows.json"), "w") as f:
    json.dump({"gpu": torch.cuda.get_device_name(0), "results": results}, f, indent=1)
