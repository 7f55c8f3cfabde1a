"""blog-a (the row whose R does not fit on chip) with persistent_mma's streamed rounds of R asked of L2 0, 2, 4 and 8
rounds ahead of the ring's copies (MmaConfig.l2_ahead), fp16 and exact fp32, checked against float64 PyTorch and timed
interleaved in one process (benchmarks/ab.py).

    PYTHONPATH=.:benchmarks python3 benchmarks/l2_ahead_ab.py [ROW ...]     -> $OUT/l2_ahead_ab.json
"""

import dataclasses
import os
import sys

import tvmrnn
from ab import compare, write
from schedules import recurrent_persistent_mma

BUILT = recurrent_persistent_mma.streaming_config
AHEAD = [int(a) for a in os.environ.get("AHEAD", "0,2,4,8").split(",")]


def build(ahead: int):
    def make(row, model):
        # read when the layer's kernel is picked: streaming_config's point with l2_ahead replaced
        recurrent_persistent_mma.streaming_config = lambda *a, **k: (lambda c: c and dataclasses.replace(c, l2_ahead=ahead))(BUILT(*a, **k))
        try:
            return tvmrnn.compile(model, target="cuda")
        finally:
            recurrent_persistent_mma.streaming_config = BUILT
    return make


NAMES = sys.argv[1:] or ["blog-a"]
write(compare(NAMES, {f"ahead {a}": build(a) for a in AHEAD}, dtypes=("float16", "float32")), "l2_ahead_ab.json")
