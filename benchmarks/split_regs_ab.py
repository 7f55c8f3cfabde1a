"""Exact-fp32 models with different points of the 3xTF32 wgmma GEMM, checked against float64 PyTorch and timed
interleaved in one process (benchmarks/ab.py).

    PYTHONPATH=.:benchmarks python3 benchmarks/split_regs_ab.py [ROW ...]            -> $OUT/split_regs_ab.json
    SET=widths PYTHONPATH=.:benchmarks python3 benchmarks/split_regs_ab.py ds2-gru

SET=tiles (default): whatever K, the layers' GEMM split in shared memory (TF32X3 before lo_w) against X split in
registers with W's low parts precomputed (lo_w): 128 x 128 with one or two 32-column chunks per ring buffer, and
64 x 128 (two blocks an SM). SET=widths: where 128 columns do not divide the gates, the staged mma.sync GEMM (what
compile took there before) against one warpgroup over 160 and over 96 columns.
"""

import os
import sys

from ab import built_with, compare, write
from schedules import projection_wgmma
from schedules.projection_wgmma import TF32X3_NARROW, WgmmaConfig

TILES = {"smem": WgmmaConfig(bn=128, stages=2, store_cols=2),
         "regs k32 s2": WgmmaConfig(bn=128, stages=2, store_cols=2, lo_w=1),
         "regs k64 s2": WgmmaConfig(bn=128, k_chunks=2, stages=2, store_cols=2, lo_w=1),
         "regs 64x128 s2": WgmmaConfig(bn=128, warpgroups=1, stages=2, store_cols=2, lo_w=1)}
# the module's constants each variant sets (read when a layer's GEMM is picked and built)
SETS = {"tiles": {name: dict(TF32X3=p, TF32X3_SMALL_K=p) for name, p in TILES.items()},
        "widths": {"staged": dict(TF32X3_NARROW={}), **{f"64x{bn}": dict(TF32X3_NARROW={bn: c}) for bn, c in TF32X3_NARROW.items()}}}

SET = os.environ.get("SET", "tiles")
NAMES = sys.argv[1:] or (["ds2-gru"] if SET == "widths" else ["blog-a", "b64-h1024-l2", "ds2-lstm"])
variants = {name: built_with(projection_wgmma, **overrides) for name, overrides in SETS[SET].items()}
write(compare(NAMES, variants, describe=lambda m: m.metadata["layers"][0]["projection"]), f"split_regs_ab_{SET}.json")
