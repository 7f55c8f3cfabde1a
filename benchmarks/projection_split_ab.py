"""The projection of dynamic-batch models at small batch: tiles picked by M at run time with K split (today) against the
large tiles for every M (before), whole models timed interleaved (benchmarks/ab.py).

    PYTHONPATH=. python3 benchmarks/projection_split_ab.py [ROW ...]    (default: the batch-1 rows)

In a model with symbolic seq and batch the staged projection used to run its large-M tiles whatever M was: lat-b1-h1024's
100 rows on 2 x 32 blocks of 64 x 128, each walking K = 1024 in 32 chunks (49 us of 0.37 ms in the H100 profile).
Setting projection_staged.SMALL_M to 0 restores that; SPLIT_MIN_CHUNKS past K's chunks keeps K whole. Writes $OUT/projection_split_ab.json.
"""

import os
import sys

import tvmrnn
from ab import compare, write
from schedules import projection_staged

NAMES = sys.argv[1:] or ["lat-b1-h1024", "lat-b1-h512-l2"]
SMALL_M = projection_staged.SMALL_M


SPLIT_MIN = projection_staged.SPLIT_MIN_CHUNKS


def build(small_m, split_min=SPLIT_MIN):
    def make(row, model):
        projection_staged.SMALL_M, projection_staged.SPLIT_MIN_CHUNKS = small_m, split_min
        try:
            return tvmrnn.compile(model, target="cuda", max_dims={"seq": row.T, "batch": row.N})
        finally:
            projection_staged.SMALL_M, projection_staged.SPLIT_MIN_CHUNKS = SMALL_M, SPLIT_MIN
    return make


VARIANTS = {"large tiles for any M": build(0), "by M, K split": build(SMALL_M), "by M, K whole": build(SMALL_M, 10**6)}
write(compare(NAMES, VARIANTS, tuple(os.environ.get("DTYPES", "float32,float16").split(","))), "projection_split_ab.json")
