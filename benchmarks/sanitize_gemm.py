"""compile's wgmma projection GEMMs, small, for compute-sanitizer (memcheck: no access outside X, W (and W's low
parts or halves), their scales, bias, XW; racecheck / synccheck): a partial row tile (M = 333) and 25 chunks of K (a
partial last ring item where a buffer holds two), each checked against float64 on a poisoned output. The f16x3 GEMMs
take X's halves from split_halves.split_on_gpu (X's kernel, sanitized with them), W's from the CPU.

    compute-sanitizer --tool memcheck python3 benchmarks/sanitize_gemm.py
"""

import numpy as np
import tvm

from schedules.projection_wgmma import DEFAULT, F16X3, TF32X3, TF32X3_SMALL_K, operands_for, projection_wgmma
from schedules.split_halves import split_on_cpu, split_on_gpu

M, K = 333, 800
hopper = tvm.target.Target({"kind": "cuda", "arch": "sm_90a"})
dev = tvm.cuda(0)
rng = np.random.default_rng(0)


def x_halves_on_gpu(x):
    """X's halves and scales by the kernel compile runs before each f16x3 GEMM (device tensors)."""
    lib = tvm.compile(tvm.IRModule({"main": split_on_gpu(K)}), target=hopper)
    p, s = tvm.runtime.tensor(np.full((M, 2 * K), np.nan, "f2"), dev), tvm.runtime.tensor(np.full(M, np.nan, "f4"), dev)
    lib["main"](tvm.runtime.tensor(x, dev), p, s)
    return [p, s]


for mode, cfg, cols, dtype, tol in (("tf32x3", TF32X3, 1024, "float32", 1e-5), ("tf32x3", TF32X3_SMALL_K, 1024, "float32", 1e-5),
                                    ("float16", DEFAULT, 1024, "float16", 1e-3), ("f16x3", F16X3[128], 1024, "float32", 1e-5),
                                    ("f16x3", F16X3[160], 1920, "float32", 1e-5)):
    func = projection_wgmma(mode, K, cols, cfg, xw_dtype=dtype)
    lib = tvm.compile(tvm.IRModule({"main": func}), target=hopper)
    x, w = rng.standard_normal((M, K)).astype(dtype), (rng.standard_normal((cols, K)) / K**0.5).astype(dtype)
    b = rng.standard_normal(cols).astype("float32")
    out = tvm.runtime.tensor(np.full((M, cols), np.nan, dtype), dev)
    inputs = [*x_halves_on_gpu(x), *split_on_cpu(w)] if mode == "f16x3" else operands_for(func, x, w)
    lib["main"](*[v if isinstance(v, tvm.runtime.Tensor) else tvm.runtime.tensor(v, dev) for v in (*inputs, b)], out)
    expected = x.astype("f8") @ w.astype("f8").T + b
    err = float(np.abs(out.numpy().astype("f8") - expected).max() / np.abs(expected).max())
    print(mode, cfg.block, f"k{32 * cfg.k_chunks}", "rel. err", err, "ok" if err < tol else "WRONG", flush=True)
