"""Whole-model time with each input-projection GEMM, same process and inputs, cuDNN beside.

    PYTHONPATH=. python3 benchmarks/projection_in_model.py [ROW ...]      (DTYPES=float32,float16 in the environment)

The build's projection on the H100 is projection_wgmma where its tiles divide the gates (fp16/bf16; exact fp32 as
3xTF32, and TF32 with precision="tf32", the bench's "tf32" kernel), else projection_staged in the same mode. Beside
it the GEMMs it replaced: projection_staged, then fp32 our exact SIMT GEMM (projection_cuda), fp16 projection_mma.
Each is what the lowering falls back to when the ones before it say they do not apply, so turning those off swaps
it in and leaves everything else about the model the same. POINTS (environment, names from benchmarks/wgmma_points.py,
comma-separated): also the model with each of those wgmma points as the mode's default (fp16: DEFAULT; fp32: TF32's
256-column point, which the "tf32" kernel builds with).
"""

import os
import sys

from schedules import projection_cuda, projection_staged, projection_wgmma
from tvmrnn import bench
from wgmma_points import WGMMA, WGMMA_TF32

NAMES = sys.argv[1:] or ["b8-h1024-l2", "b64-h1024-l2", "blog-a"]
BUILT = (projection_wgmma.supported, projection_staged.supported, projection_cuda.supported, projection_wgmma.DEFAULT, projection_wgmma.TF32)


def restore():
    (projection_wgmma.supported, projection_staged.supported, projection_cuda.supported, projection_wgmma.DEFAULT,
     projection_wgmma.TF32) = BUILT


def with_point(name):
    """The wgmma point `name` as its mode's default (projection_wgmma.default_config reads these at build time)."""
    def swap():
        if name in WGMMA:
            projection_wgmma.DEFAULT = WGMMA[name]
        else:
            projection_wgmma.TF32 = {**projection_wgmma.TF32, 256: WGMMA_TF32[name]}
    return swap


def without_wgmma():
    projection_wgmma.supported = lambda *args, **kwargs: False


def without_staged():
    without_wgmma()
    projection_staged.supported = lambda *args, **kwargs: False


# ALL=1 (environment): also the GEMMs before projection_staged
VARIANTS = {"float32": [("built today (wgmma 3xTF32 / TF32)", None), ("staged 3xTF32 / TF32", without_wgmma)]
            + [("SIMT (projection_cuda) / mma.sync TF32", without_staged)] * (os.environ.get("ALL") == "1"),
            "float16": [("built today (wgmma)", None), ("staged", without_wgmma)] + [("projection_mma", without_staged)] * (os.environ.get("ALL") == "1")}
for point in filter(None, os.environ.get("POINTS", "").split(",")):
    VARIANTS["float16" if point in WGMMA else "float32"].append((point, with_point(point)))
if os.environ.get("POINTS"):  # the default and the points only
    VARIANTS = {dtype: [v for v in variants if v[1] is None or v[0] in os.environ["POINTS"].split(",")] for dtype, variants in VARIANTS.items()}
for name in NAMES:
    row = next(r for r in bench.ROWS if r.name == name)
    for dtype in os.environ.get("DTYPES", "float32,float16").split(","):
        first = None
        for variant, swap in VARIANTS[dtype]:
            if swap:
                swap()
            try:
                res = bench.bench_gpu_row(row, kernels=("auto", "tf32"), repeats=20, dtype=dtype, cudnn=first)
            finally:
                restore()
            first = first or res
            tf32 = f", TF32 {res['tf32_ms']:.3f} ms (rel. err {res['tf32_rel_err']:.2g})" if "tf32_ms" in res else ""
            print(f"{name} {dtype} projection={variant}: exact {res['auto_ms']:.3f} ms, rel. err {res['auto_rel_err']:.2g}{tf32}; "
                  f"cuDNN TF32 {res['cudnn_tf32_ms']:.3f} fp32 {res['cudnn_fp32_ms']:.3f}", flush=True)
