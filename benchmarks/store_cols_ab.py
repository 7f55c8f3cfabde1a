"""fp16 models with the wgmma GEMM's 256-column default storing 2 or 4 columns at a time (XW in fp16, as compile builds
half layers), checked against float64 PyTorch and timed interleaved in one process (benchmarks/ab.py).

    PYTHONPATH=.:benchmarks python3 benchmarks/store_cols_ab.py [ROW ...]     -> $OUT/store_cols_ab.json
"""

import dataclasses
import sys

import tvmrnn
from ab import compare, write
from schedules import projection_wgmma

BUILT = projection_wgmma.DEFAULT


def build(store_cols: int):
    def make(row, model):
        projection_wgmma.DEFAULT = dataclasses.replace(BUILT, store_cols=store_cols)  # read when the GEMM is built
        try:
            return tvmrnn.compile(model, target="cuda")
        finally:
            projection_wgmma.DEFAULT = BUILT
    return make


NAMES = sys.argv[1:] or ["blog-a", "b64-h1024-l2"]
write(compare(NAMES, {"st2": build(2), "st4": build(4)}, dtypes=("float16",),
              describe=lambda m: m.metadata["layers"][0]["projection"]), "store_cols_ab.json")
