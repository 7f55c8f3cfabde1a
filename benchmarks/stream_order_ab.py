"""Layers whose R streams through persistent_mma's ring (blog-a): the streamed chunks read from a copy in the ring's
order made once per launch (schedules.streamed_r, the default) against R's row order, in exact fp32 (f16x3 steps) and
fp16, checked against float64 PyTorch and timed interleaved in one process (benchmarks/ab.py).

    PYTHONPATH=.:benchmarks python3 benchmarks/stream_order_ab.py [ROW ...]   -> $OUT/stream_order_ab.json
"""

import sys

from ab import built_with, compare, write
from schedules import streamed_r

variants = {"row order": built_with(streamed_r, IN_RING_ORDER=False), "ring order": built_with(streamed_r, IN_RING_ORDER=True)}
write(compare(sys.argv[1:] or ["blog-a"], variants, dtypes=("float32", "float16")), "stream_order_ab.json")
