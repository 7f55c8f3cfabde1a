"""Shared by the CPU GEMM benchmarks (cpu_projection_tiles.py, cpu_projection_ab.py): kernels built, checked against
float64 with their output poisoned, then run in turns so this VM's drift falls on every kernel alike."""

import time

import numpy as np
import tvm


def packed(w, nr: int):
    """W [N, K] in the panels projection_cpu reads: [N / nr, K, nr]."""
    n, k = w.shape
    return np.ascontiguousarray(w.reshape(n // nr, nr, k).transpose(0, 2, 1))


def turns(kernels: dict, x, w, b, target, rounds: int = 7) -> dict:
    """kernels: name -> (PrimFunc(X, W, bias, XW), W [N, K] as it reads it). Each is checked against float64 X @ W^T + b
    (relative error under 1e-5, every element written), then all run one after another, `rounds` times: name ->
    seconds of each run."""
    ref = x.astype("f8") @ w.astype("f8").T + b
    runs = {}
    for name, (func, w) in kernels.items():
        lib = tvm.compile(tvm.IRModule({"main": func}), target=target)
        args = [tvm.runtime.tensor(v) for v in (x, w, b, np.full(ref.shape, np.nan, "f4"))]
        lib["main"](*args)
        assert np.abs(args[3].numpy() - ref).max() / np.abs(ref).max() < 1e-5, name
        runs[name] = (lib["main"], args)
    times = {name: [] for name in runs}
    for _ in range(rounds):
        for name, (fn, args) in runs.items():
            t = time.perf_counter()
            fn(*args)
            times[name].append(time.perf_counter() - t)
    return times
