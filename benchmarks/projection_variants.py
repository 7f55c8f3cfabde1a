"""The fp32 projection GEMM: our kernel (schedules/projection_cuda.py) against dlight's Matmul rule and cuBLAS.

    PYTHONPATH=. python3 benchmarks/projection_variants.py [SHAPE ...]

The projection (XW = X @ W^T + bias) is 38-50% of the b64-h1024-l2 and blog-a rows in fp32 under
TVM's default schedule, dlight's Matmul rule (32 x 64 per block, 4 x 4 per thread); a first run
(benchmarks/results/2026-11-23-h100-projection-variants.md) found every larger dlight tile slower
still (12-13 TFLOP/s against the stock tile's 16 and cuBLAS's 44-52), hence our own kernel. Shapes
are the benchmark rows' projections (M = T*N, K = input size, cols = directions*gates*H); each
result is checked against cuBLAS's output (torch.addmm, TF32 off).
"""

import dataclasses
import json
import os
import sys
import time
from dataclasses import dataclass

import numpy as np
import torch
import tvm
from tvm import te, tirx
from tvm.s_tir import dlight as dl

from schedules.projection_cuda import projection_cuda

F32 = "float32"


@dataclass(frozen=True)
class ProjectionConfig:
    threads_x: int = 16  # threads per block along rows of X (block tile rows = threads_x * micro_x)
    threads_y: int = 16  # along columns of XW
    micro_x: int = 8  # accumulator tile per thread
    micro_y: int = 8
    micro_k: int = 16  # reduction columns staged per round
    vector: int = 4  # elements per load/store


class _Rule(dl.gpu.Matmul):
    def __init__(self, config: ProjectionConfig):
        super().__init__()
        self.config = config

    def get_configs(self, target):
        c = self.config
        return dataclasses.replace(super().get_configs(target), block_size_x=c.threads_x, block_size_y=c.threads_y,
                                   micro_size_x=c.micro_x, micro_size_y=c.micro_y, micro_size_k=c.micro_k, vector_size=c.vector)


def projection_dlight(K: int, cols: int, target, config: ProjectionConfig = ProjectionConfig()) -> tirx.PrimFunc:
    """PrimFunc(X [M, K], W [cols, K], bias [cols], XW [M, cols]), all fp32, scheduled for `target`."""
    M = tirx.Var("M", "int64")
    K, cols = tirx.IntImm("int64", K), tirx.IntImm("int64", cols)  # one index dtype throughout (the rule requires it)
    X = te.placeholder((M, K), F32, name="X")
    W = te.placeholder((cols, K), F32, name="W")
    bias = te.placeholder((cols,), F32, name="bias")
    k = te.reduce_axis((0, K), name="k")
    mm = te.compute((M, cols), lambda i, j: te.sum(X[i, k] * W[j, k], axis=k), name="mm")
    XW = te.compute((M, cols), lambda i, j: mm[i, j] + bias[j], name="XW")
    sch = _Rule(config).apply(te.create_prim_func([X, W, bias, XW]), target, False)
    return sch.mod["main"].with_attrs({"tirx.is_scheduled": True})


SHAPES = {"lat-b1-h512": (100, 512, 2048), "lat-b1-h1024": (100, 1024, 4096), "b8-h1024": (800, 1024, 4096), "ds2-lstm": (6000, 800, 3200), "ds2-gru": (6000, 800, 2400), "b64-h1024": (6400, 1024, 4096), "ds2-5l-bi l1+": (6000, 1600, 6400),
          "blog-a": (12800, 2560, 10240)}
CONFIGS = {"dlight stock": lambda K, cols: projection_dlight(K, cols, target, ProjectionConfig(8, 16, 4, 4, 16, 2)),
           "tvmrnn projection_cuda": projection_cuda}
torch.backends.cuda.matmul.allow_tf32 = False
target = tvm.target.Target.from_device(tvm.cuda(0))
dev = tvm.cuda(0)
results = []
for name, (M, K, cols) in SHAPES.items():
    if sys.argv[1:] and name not in sys.argv[1:]:
        continue
    x, w = torch.randn(M, K, device="cuda"), torch.randn(cols, K, device="cuda") / K**0.5
    b = torch.randn(cols, device="cuda")
    ref = torch.addmm(b, x, w.T)
    for _ in range(3):
        torch.addmm(b, x, w.T)
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(10):
        torch.addmm(b, x, w.T)
    torch.cuda.synchronize()
    cublas_ms = (time.perf_counter() - t0) / 10 * 1e3
    flop = 2 * M * K * cols
    results.append({"shape": name, "config": "cuBLAS (torch.addmm)", "ms": cublas_ms, "tflops": flop / cublas_ms / 1e9})
    print(results[-1], flush=True)
    args = [tvm.runtime.tensor(t.cpu().numpy(), dev) for t in (x, w, b)] + [tvm.runtime.tensor(np.full((M, cols), np.nan, "f4"), dev)]
    for cname, build in CONFIGS.items():
        try:
            lib = tvm.tirx.build(build(K, cols), target=target)
            lib["main"](*args)
            err = float((torch.from_numpy(args[3].numpy()).cuda() - ref).abs().max() / ref.abs().max())
            ms = lib.time_evaluator("main", dev, number=5, repeat=3)(*args).median * 1e3
            results.append({"shape": name, "config": cname, "ms": ms, "tflops": flop / ms / 1e9, "rel_err": err})
        except Exception as e:  # a config that does not build or launch is a result too
            results.append({"shape": name, "config": cname, "error": str(e)[:300]})
        print(results[-1], flush=True)
with open(os.path.join(os.environ.get("OUT", "/tmp"), "projection_variants.json"), "w") as f:
    json.dump({"gpu": torch.cuda.get_device_name(0), "results": results}, f, indent=1)
