"""The input-projection GEMMs (XW = X @ W^T + bias) at each benchmark row's shape, beside cuBLAS.

    PYTHONPATH=.:benchmarks python3 benchmarks/gemm_bench.py [SHAPE ...]        -> $OUT/gemm_bench.json

Shapes are the rows' projections (M = T*N, K, cols). fp16: cuBLAS, projection_mma, projection_wgmma's points
(wgmma_points.py) and projection_staged's. fp32: cuBLAS with TF32 off and on, the SIMT projection_cuda, and the
tensor-core modes (TF32, 3xTF32, f16x3 with the cost of X's halves) of projection_wgmma and projection_staged. Every
result is checked against float64 on a poisoned output before it is timed (TVM time_evaluator, median of 5 x 3;
cuBLAS: CUDA events, median of 10).
Environment: DTYPES=float32 one dtype; WGMMA=regex only the wgmma points named so; STAGED=default of the staged points
only compile's default, STAGED=none none; XW=float16 the fp16 GEMMs' XW in fp16, as compile builds half layers.
"""

import json
import os
import re
import sys
from dataclasses import replace

import numpy as np
import torch
import tvm

from schedules.projection_cuda import projection_cuda
from schedules.projection_mma import projection_mma
from schedules.projection_staged import StagedConfig, projection_staged, supported
from schedules.projection_wgmma import operands_for, projection_wgmma
from schedules.projection_wgmma import supported as wgmma_supported
from wgmma_points import WGMMA, WGMMA_F16X3, WGMMA_TF32, WGMMA_TF32X3

SHAPES = {"lat-b1-h512": (100, 512, 2048), "lat-b1-h1024": (100, 1024, 4096), "b8-h1024": (800, 1024, 4096), "ds2-lstm": (6000, 800, 3200),
          "ds2-gru": (6000, 800, 2400),
          "b64-h1024": (6400, 1024, 4096), "ds2-5l-bi l1+": (6000, 1600, 6400), "blog-a": (12800, 2560, 10240)}
# today's defaults (64 x 128 and 128 x 64 register-staged; the other register-staged points measured on 2026-11-23 lost
# to them and are in benchmarks/results/archive/2026-11-23-h100-projection-staged.md), then the cp.async ring (stages) with
# grouped rasterization (group): warp tiles up to 64 x 64, blocks up to 128 x 256
STAGED = {"64x128 (2x4 warps, 2x4 tiles)": StagedConfig(mt=2), "128x64 (4x2 warps, 2x4 tiles)": StagedConfig(warps_m=4, warps_n=2, mt=2),
          "64x128 (2x4 warps, 2x4 tiles) s3 g8": StagedConfig(mt=2, stages=3, group=8),
          "64x128 (2x4 warps, 2x4 tiles) s3": StagedConfig(mt=2, stages=3),
          "128x64 (4x2 warps, 2x4 tiles) s3 g8": StagedConfig(warps_m=4, warps_n=2, mt=2, stages=3, group=8),
          "128x128 (2x2 warps, 4x8 tiles) s3 g8": StagedConfig(warps_m=2, warps_n=2, mt=4, nt=8, stages=3, group=8),
          "128x128 (2x2 warps, 4x8 tiles) s4 g8": StagedConfig(warps_m=2, warps_n=2, mt=4, nt=8, stages=4, group=8),
          "128x128 (2x2 warps, 4x8 tiles) s4 g16": StagedConfig(warps_m=2, warps_n=2, mt=4, nt=8, stages=4, group=16),
          "128x256 (2x4 warps, 4x8 tiles) s3 g8": StagedConfig(warps_m=2, warps_n=4, mt=4, nt=8, stages=3, group=8),
          "128x128 (4x2 warps, 2x8 tiles) s4 g8": StagedConfig(warps_m=4, warps_n=2, mt=2, nt=8, stages=4, group=8),
          "128x128 (2x4 warps, 4x4 tiles) s4 g8": StagedConfig(warps_m=2, warps_n=4, mt=4, nt=4, stages=4, group=8),
          "128x64 (2x2 warps, 4x4 tiles) s4 g8": StagedConfig(warps_m=2, warps_n=2, mt=4, nt=4, stages=4, group=8),
          "64x128 (2x2 warps, 2x8 tiles) s4 g8": StagedConfig(warps_m=2, warps_n=2, mt=2, nt=8, stages=4, group=8)}
# fp32 registers: 3xTF32's high and low fragments of both operands; the 64 x 64 warp tile would spill
FP32_SKIP = {"128x128 (2x2 warps, 4x8 tiles) s3 g8", "128x128 (2x2 warps, 4x8 tiles) s4 g8", "128x128 (2x2 warps, 4x8 tiles) s4 g16",
             "128x256 (2x4 warps, 4x8 tiles) s3 g8"}
# STAGED=default (environment): of the staged points only today's default, beside cuBLAS and the wgmma points (none: none)
ONLY_DEFAULT = os.environ.get("STAGED") == "default"
# WGMMA=regex (environment): of the wgmma points only those whose names match (and no projection_mma)
ONLY_WGMMA = re.compile(os.environ.get("WGMMA", ""))
OUT = os.environ.get("OUT", "/tmp")
XW = os.environ.get("XW", "float32")
dev, target = tvm.cuda(0), tvm.target.Target.from_device(tvm.cuda(0))
hopper = tvm.target.Target({"kind": "cuda", "arch": "sm_90a"})
results = []


def cublas_ms(fn):
    for _ in range(3):
        fn()
    times = []
    for _ in range(10):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end))
    return float(np.median(times))


def ours(func, x, w, b, expected, tol, on=None):
    """(ms, rel. err) of one PrimFunc, output poisoned first (in its XW's dtype: fp16 within its rounding, 1e-3); None
    where it does not build or is wrong."""
    lib = tvm.tirx.build(tvm.IRModule({"main": func}), target=on or target)
    out = str(func.params[-1].dtype)
    tol = tol if out == "float32" else max(tol, 1e-3)
    args = [tvm.runtime.tensor(v, dev) for v in (*operands_for(func, x, w), b)] + [tvm.runtime.tensor(np.full(expected.shape, np.nan, out), dev)]
    lib["main"](*args)
    got = args[-1].numpy().astype("f8")
    err = float(np.abs(got - expected).max() / np.abs(expected).max())
    if np.isnan(got).any() or err > tol:
        return None, err
    timer = lib.time_evaluator("main", dev, number=5, repeat=3)
    return float(np.median(timer(*args).results)) * 1e3, err


def split_ms(x) -> float:
    """X's row scales and scaled halves as compile builds them for f16x3 (split_halves.split_on_gpu), in ms."""
    from schedules.split_halves import split_on_gpu

    M, K = x.shape
    lib = tvm.tirx.build(tvm.IRModule({"main": split_on_gpu(K)}), target=hopper)
    args = [tvm.runtime.tensor(v, dev) for v in (x, np.zeros((M, 2 * K), "f2"), np.zeros(M, "f4"))]
    return float(np.median(lib.time_evaluator("main", dev, number=5, repeat=3)(*args).results)) * 1e3


def keep(shape, dtype, name, ms, err, flop):
    results.append({"shape": shape, "dtype": dtype, "kernel": name, "ms": ms, "rel_err": err,
                    "tflops": None if ms is None else flop / ms / 1e9})
    print(results[-1], flush=True)
    with open(os.path.join(OUT, "gemm_bench.json"), "w") as f:
        json.dump({"gpu": torch.cuda.get_device_name(0), "results": results}, f, indent=1)


for shape, (M, K, cols) in SHAPES.items():
    if sys.argv[1:] and shape not in sys.argv[1:]:
        continue
    rng = np.random.default_rng(M + K)
    flop = 2 * M * K * cols
    for dtype in os.environ.get("DTYPES", "float16,float32").split(","):
        x = rng.standard_normal((M, K)).astype(dtype)
        w = (rng.standard_normal((cols, K)) / K**0.5).astype(dtype)
        b = rng.standard_normal(cols).astype("f4")
        expected = x.astype("f8") @ w.astype("f8").T + b
        tx, tw = torch.from_numpy(x).cuda(), torch.from_numpy(w).cuda()
        if dtype == "float16":
            keep(shape, dtype, "cuBLAS fp16", cublas_ms(lambda: tx @ tw.T), None, flop)
            if not ONLY_WGMMA.pattern:
                keep(shape, dtype, "projection_mma (built today)", *ours(projection_mma("float16", K, cols), x, w, b, expected, 1e-5), flop)
            variants = [(f"staged {n}", "float16", c) for n, c in STAGED.items() if not ONLY_DEFAULT or n.endswith("(2x2 warps, 4x8 tiles) s4 g8")]
            for name, cfg in WGMMA.items():
                if wgmma_supported("float16", K, cols, "sm_90a", cfg) and ONLY_WGMMA.search(name):
                    keep(shape, dtype, name, *ours(projection_wgmma("float16", K, cols, cfg, xw_dtype=XW), x, w, b, expected, 1e-5, hopper), flop)
        else:
            for tf32 in (False, True):
                torch.backends.cuda.matmul.allow_tf32 = tf32
                keep(shape, dtype, f"cuBLAS fp32 (TF32 {'on' if tf32 else 'off'})", cublas_ms(lambda: tx @ tw.T), None, flop)
            keep(shape, dtype, "projection_cuda SIMT (built today)", *ours(projection_cuda(K, cols), x, w, b, expected, 1e-5), flop)
            # 3xTF32 with chunk_acc (its default: without it blog-a's K = 2560 is off by 1.4e-5)
            variants = [(f"staged {mode} {n}", mode, replace(c, chunk_acc=mode == "tf32x3"))
                        for mode in ("tf32x3", "tf32") for n, c in STAGED.items() if n not in FP32_SKIP
                        and (not ONLY_DEFAULT or n.endswith("(2x2 warps, 4x4 tiles) s4 g8"))]
            for name, cfg in WGMMA_TF32.items():
                if wgmma_supported("tf32", K, cols, "sm_90a", cfg) and ONLY_WGMMA.search(name):
                    keep(shape, dtype, name, *ours(projection_wgmma("tf32", K, cols, cfg), x, w, b, expected, 3e-3, hopper), flop)
            for name, cfg in WGMMA_TF32X3.items():
                if wgmma_supported("tf32x3", K, cols, "sm_90a", cfg) and ONLY_WGMMA.search(name):
                    keep(shape, dtype, name, *ours(projection_wgmma("tf32x3", K, cols, cfg), x, w, b, expected, 1e-5, hopper), flop)
            if any(ONLY_WGMMA.search(name) for name in WGMMA_F16X3):  # what f16x3 adds before its GEMM: X's halves
                keep(shape, dtype, "f16x3: X's scales and halves", split_ms(x), None, 0)
            for name, cfg in WGMMA_F16X3.items():
                if wgmma_supported("f16x3", K, cols, "sm_90a", cfg) and ONLY_WGMMA.search(name):
                    keep(shape, dtype, name, *ours(projection_wgmma("f16x3", K, cols, cfg), x, w, b, expected, 1e-5, hopper), flop)
        for name, mode, cfg in variants * (os.environ.get("STAGED") != "none"):
            xw = XW if mode == "float16" else "float32"
            if supported(mode, K, cols, cfg, xw_dtype=xw):
                keep(shape, dtype, name, *ours(projection_staged(mode, K, cols, cfg, xw_dtype=xw), x, w, b, expected, 3e-3 if mode == "tf32" else 1e-5), flop)
