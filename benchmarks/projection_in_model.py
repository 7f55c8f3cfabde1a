"""Whole-model time with each input-projection GEMM, same process and inputs, cuDNN beside.

    PYTHONPATH=. python3 benchmarks/projection_in_model.py [ROW ...]

The build's projection is projection_staged (fp16/bf16, and 3xTF32 for exact fp32). Beside it, the GEMMs it
replaced: fp32 our exact SIMT GEMM (projection_cuda) and TVM's default matmul schedule, fp16 projection_mma.
Each is what the lowering falls back to when projection_staged (then projection_cuda) says it does not apply,
so turning those off swaps it in and leaves everything else about the model the same.
"""

import sys

from schedules import projection_cuda, projection_staged
from tvmrnn import bench

NAMES = sys.argv[1:] or ["lat-b1-h1024", "b8-h1024-l2", "b64-h1024-l2", "blog-a"]
BUILT = (projection_staged.supported, projection_cuda.supported)


def without_staged():
    projection_staged.supported = lambda *args, **kwargs: False


def tvm_default():
    without_staged()
    projection_cuda.supported = lambda K, cols: False


VARIANTS = {"float32": [("staged 3xTF32 (built today)", None), ("SIMT (projection_cuda)", without_staged), ("relax matmul (dlight)", tvm_default)],
            "float16": [("staged (built today)", None), ("projection_mma", without_staged)]}
for name in NAMES:
    row = next(r for r in bench.ROWS if r.name == name)
    for dtype, variants in VARIANTS.items():
        first = None
        for variant, swap in variants:
            if swap:
                swap()
            try:
                res = bench.bench_gpu_row(row, kernels=("auto",), repeats=20, dtype=dtype, cudnn=first)
            finally:
                projection_staged.supported, projection_cuda.supported = BUILT
            first = first or res
            print(f"{name} {dtype} projection={variant}: auto {res['auto_ms']:.3f} ms, rel. err {res['auto_rel_err']:.2g}, "
                  f"cuDNN TF32 {res['cudnn_tf32_ms']:.3f} fp32 {res['cudnn_fp32_ms']:.3f}", flush=True)
