"""persistent_mma's batch tiles at batch 8-20 in exact fp32 (3xTF32): whole models, points side by side, interleaved (ab.py).

    python3 benchmarks/resident_tiles_ab.py [ROW ...]     (default ds2-lstm ds2-gru ds2-5l-bi b8-h1024-l2; fp32)

At batch 20 the default's 2 x 2 tiles of 8 rows pad the batch to 32, a third of the mma's wasted; 3 tiles (24 rows)
waste a sixth. Each point replaces persistent_mma's default for every batch of the row's module (units as the default
picks them: 8, or 16 where two directions need it for one wave).
"""

import sys
from dataclasses import replace

import tvmrnn
from ab import compare, write
from schedules import recurrent_persistent_mma as resident

_default = resident.default_config
POINTS = {
    "3x1 k8 pf": dict(n_tiles=3, n_warps=1, k_warps=8, depth=2, prefetch=1),
    "3x1 k4 pf": dict(n_tiles=3, n_warps=1, k_warps=4, depth=2, prefetch=1),
    "1x3 k4 pf": dict(n_tiles=1, n_warps=3, k_warps=4, depth=2, prefetch=1),
    "2x2 k8 pf": dict(n_tiles=2, n_warps=2, k_warps=8, depth=2, prefetch=1),
    "2x1 k8 pf": dict(n_tiles=2, n_warps=1, k_warps=8, depth=2, prefetch=1),
    "1x1 k16 pf": dict(n_tiles=1, n_warps=1, k_warps=16, depth=2, prefetch=1),  # batch 8: half the reduction per warp
}


def build(point=None):
    def make(row, model):
        if point:
            def config(spec, cell, arch, batch=None):  # a point that does not fit beside R runs the default
                cfg = replace(_default(spec, cell, arch, batch), **point)
                return cfg if resident.fits(spec, cell, arch, cfg) else _default(spec, cell, arch, batch)

            resident.default_config = config
        try:
            return tvmrnn.compile(model, target="cuda", logs=False, max_dims={"seq": row.T, "batch": row.N})
        finally:
            resident.default_config = _default
    return make


variants = {"default": build()} | {name: build(p) for name, p in POINTS.items()}
results = compare(sys.argv[1:] or ["ds2-lstm", "ds2-gru", "ds2-5l-bi", "b8-h1024-l2"], variants, ("float32",))
write(results, "resident_tiles_ab.json")
