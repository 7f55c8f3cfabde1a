"""Whole-model time with our fp32 projection against TVM's default matmul schedule, same process and inputs.

    PYTHONPATH=. python3 benchmarks/projection_in_model.py [ROW ...]
"""

import sys

from schedules import projection_cuda
from tvmrnn import bench

NAMES = sys.argv[1:] or ["lat-b1-h1024", "b8-h1024-l2"]
supported = projection_cuda.supported
for name in NAMES:
    row = next(r for r in bench.ROWS if r.name == name)
    first = None
    for variant, rule in (("ours", supported), ("relax matmul (dlight)", lambda K, cols: False)):
        projection_cuda.supported = rule
        res = bench.bench_gpu_row(row, kernels=("auto",), repeats=20, dtype="float32", cudnn=first)
        first = first or res
        print(f"{name} float32 projection={variant}: auto {res['auto_ms']:.3f} ms, rel. err {res['auto_rel_err']:.2g}, "
              f"cuDNN TF32 {res['cudnn_tf32_ms']:.3f} fp32 {res['cudnn_fp32_ms']:.3f}", flush=True)
    projection_cuda.supported = supported
