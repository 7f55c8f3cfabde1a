"""Layers whose R streams through persistent_mma's ring (blog-a), in exact fp32 (f16x3 steps) and fp16, two ways each,
checked against float64 PyTorch and timed interleaved in one process (benchmarks/ab.py):
- SET=order (default): the streamed chunks read from a copy in the ring's order made once per launch
  (schedules.streamed_r, the default) against R's row order;
- SET=early: the ring's first rounds of R copied right after the reduction before (EARLY_ROUNDS) against each
  reduction copying its own (tried at 8b2c5b7, slower: 2026-11-26-h100-stream-order.md; removed with the knob);
- SET=sums: the k_warps' partial sums in the ring's A buffers (SUMS_IN_RING: blog-a then keeps 4 more chunks of R
  resident in exact fp32, 8 in fp16) against a buffer of their own.

    SET=order|sums PYTHONPATH=.:benchmarks python3 benchmarks/stream_order_ab.py [ROW ...]   -> $OUT/stream_<SET>_ab.json
"""

import os
import sys

from ab import built_with, compare, write
from schedules import recurrent_persistent_mma, streamed_r

SET = os.environ.get("SET", "order")
SETS = {"order": {"row order": built_with(streamed_r, IN_RING_ORDER=False), "ring order": built_with(streamed_r, IN_RING_ORDER=True)},
        "sums": {"own buffer": built_with(recurrent_persistent_mma, SUMS_IN_RING=False),
                 "sums in ring": built_with(recurrent_persistent_mma, SUMS_IN_RING=True)}}
write(compare(sys.argv[1:] or ["blog-a"], SETS[SET], dtypes=("float32", "float16")), f"stream_{SET}_ab.json")
