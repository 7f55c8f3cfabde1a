"""The CPU projection GEMM of this checkout against the one at an earlier git revision, side by side in one process.

    PYTHONPATH=. python3 benchmarks/cpu_projection_ab.py [REV]     (default REV: eb4de3a, W as W^T rows)

Each shape of the CPU benchmark rows' projections runs both kernels in turns (7 rounds, the minimum
reported), after checking both against float64. The earlier kernel is read with `git show REV:...`;
its W layout is told by whether it has panel_width (W^T [K, cols] before the packed panels). This checkout's
kernel takes this CPU's tile (projection_cpu.tile for the target's mcpu).
"""

import subprocess
import sys
import types

import numpy as np

from cpu_gemm import packed, turns
from schedules.projection_cpu import panel_width, projection_cpu
from tvmrnn.build import resolve_target
from tvmrnn.runtime import use_every_core

REV = sys.argv[1] if len(sys.argv) > 1 else "eb4de3a"
SHAPES = [(6000, 800, 3200), (6000, 800, 2400), (100, 512, 2048), (6400, 1024, 4096), (100, 1024, 4096)]  # ds2(-gru), lat-b1-h512, b64, lat-b1-h1024


def earlier_kernel():
    src = subprocess.run(["git", "show", f"{REV}:schedules/projection_cpu.py"], capture_output=True, text=True, check=True).stdout
    mod = types.ModuleType("projection_cpu_earlier")
    exec(compile(src.replace("from .recurrent_common", "from schedules.recurrent_common"), "projection_cpu_earlier", "exec"), mod.__dict__)
    return mod.projection_cpu, mod.__dict__.get("panel_width")  # None: W^T, before the packed panels


def weights(w, panel_width):
    return np.ascontiguousarray(w.T) if panel_width is None else packed(w, panel_width(w.shape[0]))


use_every_core()  # TVM's thread pool as tvmrnn runs it (importing tvmrnn.runtime already did)
target = resolve_target("llvm")
MCPU = str(target.attrs.get("mcpu", ""))
old_kernel, old_panels = earlier_kernel()
rng = np.random.default_rng(0)
for M, K, N in SHAPES:
    x, w, b = rng.standard_normal((M, K)).astype("f4"), rng.standard_normal((N, K)).astype("f4"), rng.standard_normal(N).astype("f4")
    times = turns({REV: (old_kernel(K, N), weights(w, old_panels)),
                   "this checkout": (projection_cpu(K, N, MCPU), weights(w, lambda n: panel_width(n, MCPU)))}, x, w, b, target)
    print(f"M={M} K={K} N={N}: " + ", ".join(f"{name} {min(t) * 1e3:.2f} ms ({2 * M * K * N / min(t) / 1e9:.0f} GFLOP/s)"
                                          for name, t in times.items()), flush=True)
