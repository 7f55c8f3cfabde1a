"""Exact-fp32 models with their input projections as three fp16 products of scaled halves (f16x3, compile's GEMM on
sm_90a) against 3xTF32's three TF32 products (X split in registers, W's low parts precomputed: compile's GEMM before),
checked against float64 PyTorch and timed interleaved in one process (benchmarks/ab.py).

    PYTHONPATH=.:benchmarks python3 benchmarks/halves_ab.py [ROW ...]            -> $OUT/halves_ab_modes.json
    SET=tiles PYTHONPATH=.:benchmarks python3 benchmarks/halves_ab.py [ROW ...]  -> $OUT/halves_ab_tiles.json

SET=modes (default): f16x3 against 3xTF32. SET=tiles: f16x3's compile points (one warpgroup over 160 or 128 columns)
against 128 x 128 blocks of two.
"""

import os
import sys

from ab import built_with, compare, write
from schedules import projection_wgmma
from schedules.projection_wgmma import F16X3, WgmmaConfig

TILES = {"64x160|128 k64 s2": F16X3,
         "128x128 k64 s3": {128: WgmmaConfig(bn=128, k_chunks=2, stages=3, store_cols=2)}}
SETS = {"modes": {"3xTF32": dict(EXACT_ON_HALVES=False), "f16x3": dict(EXACT_ON_HALVES=True)},
        "tiles": {name: dict(F16X3=p) for name, p in TILES.items()}}

SET = os.environ.get("SET", "modes")
NAMES = sys.argv[1:] or ["blog-a", "b64-h1024-l2", "ds2-lstm", "ds2-gru", "ds2-5l-bi", "b8-h1024-l2", "lat-b1-h1024"]
variants = {name: built_with(projection_wgmma, **overrides) for name, overrides in SETS[SET].items()}
write(compare(NAMES, variants, describe=lambda m: " | ".join(layer["projection"] for layer in m.metadata["layers"][:2])),
      f"halves_ab_{SET}.json")
