"""Exact-fp32 models with the 3xTF32 wgmma GEMM splitting its operands in shared memory (TF32X3 before lo_w) against
splitting X in registers with W's low parts precomputed (lo_w): 128 x 128 with one or two 32-column chunks per ring
buffer, and 64 x 128 (two blocks an SM), two buffers each; checked against float64 PyTorch and timed interleaved in
one process (benchmarks/ab.py).

    PYTHONPATH=.:benchmarks python3 benchmarks/split_regs_ab.py [ROW ...]     -> $OUT/split_regs_ab.json
"""

import sys

import tvmrnn
from ab import compare, write
from schedules import projection_wgmma
from schedules.projection_wgmma import WgmmaConfig

BUILT = projection_wgmma.TF32X3
POINTS = {"smem": WgmmaConfig(bn=128, stages=2, store_cols=2),
          "regs k32 s2": WgmmaConfig(bn=128, stages=2, store_cols=2, lo_w=1),
          "regs k64 s2": WgmmaConfig(bn=128, k_chunks=2, stages=2, store_cols=2, lo_w=1),
          "regs 64x128 s2": WgmmaConfig(bn=128, warpgroups=1, stages=2, store_cols=2, lo_w=1)}


def build(point: WgmmaConfig):
    def make(row, model):
        projection_wgmma.TF32X3 = point  # read when the layer's GEMM is picked and built
        try:
            return tvmrnn.compile(model, target="cuda")
        finally:
            projection_wgmma.TF32X3 = BUILT
    return make


NAMES = sys.argv[1:] or ["blog-a", "b64-h1024-l2", "ds2-lstm"]
variants = {name: build(p) for name, p in POINTS.items()}
write(compare(NAMES, variants, describe=lambda m: m.metadata["layers"][0]["projection"]), "split_regs_ab.json")
