"""compile's wgmma projection GEMMs, small, for compute-sanitizer (memcheck: no access outside X, W (and W's low
parts), bias, XW; racecheck / synccheck): a partial row tile (M = 333) and 25 chunks of K (a partial last ring item
where a buffer holds two), each checked against float64 on a poisoned output.

    compute-sanitizer --tool memcheck python3 benchmarks/sanitize_gemm.py
"""

import numpy as np
import tvm

from schedules.projection_wgmma import DEFAULT, TF32X3, TF32X3_SMALL_K, operands_for, projection_wgmma

M, K, COLS = 333, 800, 1024
hopper = tvm.target.Target({"kind": "cuda", "arch": "sm_90a"})
dev = tvm.cuda(0)
rng = np.random.default_rng(0)
for mode, cfg, dtype, tol in (("tf32x3", TF32X3, "float32", 1e-5), ("tf32x3", TF32X3_SMALL_K, "float32", 1e-5),
                              ("float16", DEFAULT, "float16", 1e-3)):
    func = projection_wgmma(mode, K, COLS, cfg, xw_dtype=dtype)
    lib = tvm.compile(tvm.IRModule({"main": func}), target=hopper)
    x, w = rng.standard_normal((M, K)).astype(dtype), (rng.standard_normal((COLS, K)) / K**0.5).astype(dtype)
    b = rng.standard_normal(COLS).astype("float32")
    out = tvm.runtime.tensor(np.full((M, COLS), np.nan, dtype), dev)
    lib["main"](*[tvm.runtime.tensor(v, dev) for v in (*operands_for(func, x, w), b)], out)
    expected = x.astype("f8") @ w.astype("f8").T + b
    err = float(np.abs(out.numpy().astype("f8") - expected).max() / np.abs(expected).max())
    print(mode, cfg.block, f"k{32 * cfg.k_chunks}", "rel. err", err, "ok" if err < tol else "WRONG", flush=True)
