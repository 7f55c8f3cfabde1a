"""Exact-fp32 models whose persistent tensor-core steps run f16x3 (three fp16 products of scaled halves,
schedules.step_halves: today's default where the cell bounds h) against 3xTF32 steps (three TF32 products, the default
before), checked against float64 PyTorch and timed interleaved in one process (benchmarks/ab.py).

    PYTHONPATH=.:benchmarks python3 benchmarks/step_halves_ab.py [ROW ...]              -> $OUT/step_halves_ab.json
    SET=streamed PYTHONPATH=.:benchmarks python3 benchmarks/step_halves_ab.py [ROW ...] -> $OUT/step_halves_ab_streamed.json

SET=streamed: layers whose R streams from L2 (blog-a) with f16x3 steps (HALVES_STREAMED) against 3xTF32.
"""

import os
import sys

from ab import built_with, compare, write
from schedules import recurrent_persistent_mma

SET = os.environ.get("SET", "resident")
SETS = {"resident": {"3xTF32 steps": dict(HALVES=False), "f16x3 steps": dict(HALVES=True)},
        "streamed": {"3xTF32 streamed steps": dict(HALVES_STREAMED=False), "f16x3 streamed steps": dict(HALVES_STREAMED=True)}}
DEFAULT_ROWS = {"resident": ["b64-h1024-l2", "ds2-lstm", "ds2-gru", "b8-h1024-l2", "blog-b", "ds2-5l-bi"], "streamed": ["blog-a"]}
NAMES = sys.argv[1:] or DEFAULT_ROWS[SET]
variants = {name: built_with(recurrent_persistent_mma, **overrides) for name, overrides in SETS[SET].items()}
write(compare(NAMES, variants), "step_halves_ab.json" if SET == "resident" else "step_halves_ab_streamed.json")
