"""The projection of dynamic-batch models at small batch: tiles picked by M at run time (today) against the
large tiles for every M (before), whole models timed interleaved (benchmarks/ab.py).

    PYTHONPATH=. python3 benchmarks/projection_split_ab.py [ROW ...]    (default: the batch-1 rows)

In a model with symbolic seq and batch the staged projection used to run its large-M tiles whatever M was: lat-b1-h1024's
100 rows on 2 x 32 blocks of 64 x 128, each walking K = 1024 in 32 chunks (49 us of 0.37 ms in the H100 profile).
Setting projection_staged.SMALL_M to 0 restores that. (A third variant, K split 4 or 2 ways for the small tiles, measured
no faster and no default uses it: `git show e337a00:benchmarks/projection_split_ab.py`.) Writes $OUT/projection_split_ab.json.
"""

import os
import sys

import tvmrnn
from ab import compare, write
from schedules import projection_staged

NAMES = sys.argv[1:] or ["lat-b1-h1024", "lat-b1-h512-l2"]
SMALL_M = projection_staged.SMALL_M


def build(small_m):
    def make(row, model):
        projection_staged.SMALL_M = small_m
        try:
            return tvmrnn.compile(model, target="cuda", max_dims={"seq": row.T, "batch": row.N})
        finally:
            projection_staged.SMALL_M = SMALL_M
    return make


VARIANTS = {"large tiles for any M": build(0), "by M": build(SMALL_M)}
write(compare(NAMES, VARIANTS, tuple(os.environ.get("DTYPES", "float32,float16").split(","))), "projection_split_ab.json")
