"""Whole-model time with each input-projection GEMM, same process and inputs, cuDNN beside.

    PYTHONPATH=. python3 benchmarks/projection_in_model.py [ROW ...]

fp32: our exact SIMT GEMM (projection_cuda, what the build uses), TVM's default matmul schedule, and
projection_staged in 3xTF32 (exact fp32 on tensor cores). fp16: projection_mma (what the build uses)
and projection_staged. The alternatives are swapped in for the build's own (the lowering calls
them through their modules), so everything else about the model is the same.
"""

import sys

from schedules import projection_cuda, projection_mma, projection_staged
from tvmrnn import bench

NAMES = sys.argv[1:] or ["lat-b1-h1024", "b8-h1024-l2", "b64-h1024-l2", "blog-a"]
BUILT = (projection_cuda.supported, projection_mma.supported, projection_mma.projection_mma)


def staged_everywhere():
    """Every CUDA projection through projection_staged: exact fp32 (mode None) as 3xTF32."""
    projection_mma.supported = lambda mode, K, cols: projection_staged.supported(mode or "tf32x3", K, cols)
    projection_mma.projection_mma = lambda mode, K, cols: projection_staged.projection_staged(mode or "tf32x3", K, cols)


def tvm_default():
    projection_cuda.supported = lambda K, cols: False


VARIANTS = {"float32": [("ours (SIMT, built today)", None), ("relax matmul (dlight)", tvm_default), ("staged 3xTF32", staged_everywhere)],
            "float16": [("projection_mma (built today)", None), ("staged", staged_everywhere)]}
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
                projection_cuda.supported, projection_mma.supported, projection_mma.projection_mma = BUILT
            first = first or res
            print(f"{name} {dtype} projection={variant}: auto {res['auto_ms']:.3f} ms, rel. err {res['auto_rel_err']:.2g}, "
                  f"cuDNN TF32 {res['cudnn_tf32_ms']:.3f} fp32 {res['cudnn_fp32_ms']:.3f}", flush=True)
