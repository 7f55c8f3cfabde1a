"""The CPU projection GEMM at one shape in several tiles (rows x columns of accumulators per work item), side by side.

    PYTHONPATH=. python3 benchmarks/cpu_projection_tiles.py M,K,N 8x32 6x64 8x48 ...

Each tile's kernel (schedules/projection_cpu with tile_shape) is checked against float64 with W packed in its panels,
then all run in turns, 7 rounds; min and median per tile. What projection_cpu.tile's choices rest on.
"""

import sys

import numpy as np

from cpu_gemm import packed, turns
from schedules.projection_cpu import projection_cpu
from tvmrnn.build import resolve_target
from tvmrnn.runtime import use_every_core

use_every_core()
target = resolve_target("llvm")
M, K, N = (int(v) for v in sys.argv[1].split(","))
rng = np.random.default_rng(0)
x, w, b = rng.standard_normal((M, K)).astype("f4"), rng.standard_normal((N, K)).astype("f4"), rng.standard_normal(N).astype("f4")
shapes = {name: tuple(int(v) for v in name.split("x")) for name in sys.argv[2:]}
times = turns({name: (projection_cpu(K, N, tile_shape=(mr, nr)), packed(w, nr)) for name, (mr, nr) in shapes.items()}, x, w, b, target)
for name, t in times.items():
    print(f"{name} min {min(t) * 1e3:.1f} ms median {np.median(t) * 1e3:.1f} ms  {2 * M * K * N / min(t) / 1e9:.0f} GFLOP/s")
