"""Exact-fp32 models whose persistent tensor-core steps run f16x3 (three fp16 products of scaled halves,
schedules.step_halves: today's default where the cell bounds h) against 3xTF32 steps (three TF32 products, the default
before), checked against float64 PyTorch and timed interleaved in one process (benchmarks/ab.py).

    PYTHONPATH=.:benchmarks python3 benchmarks/step_halves_ab.py [ROW ...]   -> $OUT/step_halves_ab.json
"""

import sys

from ab import built_with, compare, write
from schedules import recurrent_persistent_mma

NAMES = sys.argv[1:] or ["b64-h1024-l2", "ds2-lstm", "ds2-gru", "b8-h1024-l2", "blog-b", "ds2-5l-bi"]
variants = {"3xTF32 steps": built_with(recurrent_persistent_mma, HALVES=False),
            "f16x3 steps": built_with(recurrent_persistent_mma, HALVES=True)}
write(compare(NAMES, variants), "step_halves_ab.json")
